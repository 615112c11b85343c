"""psrl.tms and topology.colocate: the seeds' rules, each refused with the field and the fix."""

from __future__ import annotations

import pytest
import torch

from psrl.config import load_config
from psrl.errors import ConfigError
from psrl.preflight import check_environment

COLOCATED = ("topology.colocate=True", "topology.device=cuda")


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    return str(info.value)


def test_range_without_colocation_is_refused() -> None:
    msg = refused("psrl.tms.range=all")
    assert "psrl.tms.range" in msg and "topology.colocate=True" in msg


def test_colocation_needs_a_range() -> None:
    assert "set psrl.tms.range=all" in refused(*COLOCATED)


def test_range_rollout_leaves_the_trainer_resident_and_is_refused() -> None:
    msg = refused(*COLOCATED, "psrl.tms.range=rollout")
    assert "optimizer offload" in msg and "psrl.tms.range=all" in msg


def test_cuda_graphs_need_range_all() -> None:
    assert "set psrl.tms.range=all" in refused(*COLOCATED, "psrl.tms.range=train", "psrl.tms.enable_cuda_graph=True")


def test_enable_nixl_is_refused_since_nothing_reads_it() -> None:
    assert "psrl.tms.enable_nixl" in refused(*COLOCATED, "psrl.tms.range=all", "psrl.tms.enable_nixl=True")


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("topology.device=cpu", "topology.device"),
        ("engine.backend=vllm", "engine.backend"),
        ("psrl.fine_grain_overlap.granularity=mini_batch", "psrl.fine_grain_overlap.granularity"),
        ("topology.trainer_gpus=[0]", "topology.rollout_gpus"),
        ("trainer.background_push=true", "trainer.background_push"),
    ],
)
def test_colocation_prerequisites(override: str, field: str) -> None:
    msg = refused("topology.colocate=True", "psrl.tms.range=all", override)
    assert field in msg


def test_valid_colocated_config_loads() -> None:
    config = load_config(None, [*COLOCATED, "psrl.tms.range=all", "psrl.tms.enable_cuda_graph=True"])
    assert config.topology.colocate and config.psrl.tms.range == "all"


def test_background_push_is_on_by_auto_only_for_a_cuda_trainer_with_its_own_gpu_and_room_for_the_snapshot() -> None:
    loop = load_config(None, []).trainer
    gib = 1 << 30
    assert loop.background_push_on("cuda", colocate=False, snapshot_bytes=gib, device_bytes=80 * gib)
    assert not loop.background_push_on("cuda", colocate=False, snapshot_bytes=15 * gib, device_bytes=80 * gib)
    assert not loop.background_push_on("cuda", colocate=True, snapshot_bytes=gib, device_bytes=80 * gib)
    assert not loop.background_push_on("cpu", colocate=False, snapshot_bytes=gib, device_bytes=0)
    forced = load_config(None, ["trainer.background_push=true"]).trainer
    assert forced.background_push_on("cpu", colocate=False, snapshot_bytes=gib, device_bytes=0)
    assert not load_config(None, ["trainer.background_push=false"]).trainer.background_push_on(
        "cuda", colocate=False, snapshot_bytes=gib, device_bytes=80 * gib
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_any_range_without_cuda_is_refused_before_anything_starts() -> None:
    config = load_config(None, ["topology.colocate=True", "psrl.tms.range=train"])
    problems = [p for p in check_environment(config) if "psrl.tms.range" in p.paths]
    assert problems, "the environment check must refuse psrl.tms.range on a machine without CUDA"
    assert any("no CUDA device" in p.message for p in problems)
