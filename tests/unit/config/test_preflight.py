"""Checks against the machine, run by `psrl config show` and before `psrl launch` starts a process.

Each case here was once accepted by `psrl config show` and failed 25-45 s into a launch."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from psrl.assets import DEMO_MODEL_DIR
from psrl.cli.main import main
from psrl.config import load_config
from psrl.preflight import absolute_paths, check_environment


def show(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["config", "show", "demo", *args])


def refused(result, *fragments: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"add {i} 1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    return path


def test_unknown_task_is_refused_before_launch() -> None:
    refused(show("task.name=gsm8k"), "task.name", "unknown task", "demo_short", "data.train_files")


def test_sessions_need_an_environment_task() -> None:
    refused(show("env.enable=True", "task.name=demo"), "task.name", "multi-turn sessions need an environment task",
            "digit_chain")  # fmt: skip


def test_an_environment_is_a_task_name() -> None:
    assert show("task.name=digit_chain").exit_code == 0


def test_missing_model_directory_is_refused() -> None:
    refused(show("model.path=/nonexistent"), "model.path", "no such directory")


def test_unsupported_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    refused(show(f"model.path={tmp_path}"), "model.path", "'gpt2' is not supported", "llama, qwen2, qwen3")


@pytest.mark.skipif(importlib.util.find_spec("nixl") is not None, reason="nixl is installed here")
def test_transport_without_its_extra_is_refused() -> None:
    refused(show("psrl.ps.transport=nixl"), "psrl.ps.transport", "'nixl'", "psrl[kv]")


def test_gpu_settings_without_a_gpu_are_refused() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    refused(show("topology.device=cuda"), "topology.device", "no CUDA device")


def test_dataset_and_reward_problems(dataset: Path, tmp_path: Path) -> None:
    refused(show(f"data.train_files={dataset}"), "reward.function", "no reward of its own")
    refused(show(f"data.train_files={tmp_path}/none.jsonl", "reward.function=psrl.rewards.builtin:exact_match"),
            "data.train_files", "no such file")  # fmt: skip
    refused(show(f"data.train_files={dataset}", "data.prompt_key=question",
                 "reward.function=psrl.rewards.builtin:exact_match"), "no 'question' column")  # fmt: skip
    refused(show(f"data.train_files={dataset}", "reward.function=psrl.rewards.builtin:nothing"), "has no 'nothing'")
    bad = tmp_path / "r.py"
    bad.write_text("def score(response, judge):\n    return 0.0\n")
    refused(show(f"data.train_files={dataset}", f"reward.function={bad}:score"), "required argument 'judge'")
    refused(show("data.val_files=[x.jsonl]"), "data.val_files", "needs a training dataset")


def test_a_good_dataset_passes_with_absolute_paths(dataset: Path, tmp_path: Path) -> None:
    reward = tmp_path / "r.py"
    reward.write_text("def score(response, answer):\n    return float(response == answer)\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = show("data.train_files=train.jsonl", "reward.function=r.py:score")
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    assert f"- {dataset}" in result.output and f"function: {reward}:score" in result.output


def test_checks_collect_every_problem_at_once() -> None:
    config = absolute_paths(load_config("demo", ["model.path=/nonexistent", "task.name=nope"]))
    problems = check_environment(config)
    assert {p.paths[0] for p in problems} == {"model.path", "task.name"}
    assert check_environment(load_config("demo", [f"model.path={DEMO_MODEL_DIR}"])) == []


def test_no_checks_flag_prints_without_looking() -> None:
    assert CliRunner().invoke(main, ["config", "show", "--no-checks", "model.path=/nonexistent"]).exit_code == 0


def test_launch_refuses_before_starting_anything(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["launch", "demo", "model.path=/nonexistent", "--root", str(tmp_path)])
    refused(result, "model.path", "no such directory")
    assert not any(tmp_path.iterdir()), "no run directory is created for a refused launch"


def test_a_broken_tokenizer_is_refused_before_launch_without_importing_transformers(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(DEMO_MODEL_DIR, model)
    (model / "tokenizer.json").write_text("{not json")
    refused(show(f"model.path={model}"), "model.path", "no loadable tokenizer", "model.tokenizer_path")
    probe = (  # the demo's checks read the fast tokenizer's file alone: the launcher starts without torch
        "import sys; from psrl.config import load_config; from psrl.preflight import check_environment; "
        "assert not check_environment(load_config('demo')); "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["False", "False"], done.stdout + done.stderr
