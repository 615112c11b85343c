"""Data parallelism with two real gloo processes: the result must match one process on the same data."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from psrl.trainer import TrainerCore

from .trainer_helpers import NUM_DP_BUFFERS, make_buffer, trainer_config

WORKER = Path(__file__).parent / "dp_worker.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    model_dir: Path, out_dir: Path, strategy: str, estimator: str, world_size: int = 2, overrides: tuple[str, ...] = ()
) -> dict:
    port = free_port()
    processes = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        command = [sys.executable, str(WORKER), str(model_dir), str(out_dir), strategy, estimator, *overrides]
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    for process in processes:
        output, _ = process.communicate(timeout=240)
        outputs.append(output.decode(errors="replace"))
    for rank, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank} failed:\n{output[-3000:]}"
    return json.loads((out_dir / "result.json").read_text())


@pytest.mark.parametrize(("strategy", "estimator"), [("ddp", "grpo"), ("fsdp2", "gae")])
def test_two_ranks_match_one_process(tiny_model_dir: Path, tmp_path: Path, strategy: str, estimator: str) -> None:
    result = run_ranks(tiny_model_dir, tmp_path, strategy, estimator)
    distributed = load_file(str(tmp_path / "weights.safetensors"))

    single = TrainerCore(trainer_config([f"algorithm.adv_estimator={estimator}"]), model_dir=tiny_model_dir)
    single_metrics = [single.train_buffer(b, make_buffer(b)).metrics for b in range(NUM_DP_BUFFERS)]
    expected = {name: tensor for name, tensor in single.named_weights()}
    assert distributed.keys() == expected.keys()
    initial = TrainerCore(trainer_config(), model_dir=tiny_model_dir)
    start = dict(initial.named_weights())
    for name, tensor in expected.items():
        assert not torch.equal(tensor, start[name]) or name.endswith("bias")  # training moved the weights
        torch.testing.assert_close(distributed[name], tensor, atol=2e-5, rtol=1e-4)
    for key in ("actor/pg_loss", "actor/clip_frac", "reward/mean", "rollout_is/mean"):
        assert result["metrics"][-1][key] == pytest.approx(single_metrics[-1][key], abs=1e-4), key

    assert result["resumed_equal"] and result["version"] == NUM_DP_BUFFERS  # resumed by both ranks

    # The checkpoint written collectively by both ranks resumes in one process.
    resumed = TrainerCore(trainer_config([f"algorithm.adv_estimator={estimator}"]), model_dir=tiny_model_dir)
    assert resumed.load_checkpoint(result["checkpoint"]) == NUM_DP_BUFFERS
    for name, tensor in resumed.named_weights():
        torch.testing.assert_close(tensor, distributed[name], atol=0, rtol=0)


def test_two_ranks_deal_their_own_samples(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`actor.shuffle_samples` over ranks: each rank deals its own samples into as many steps, the steps'
    normalisers summed over both; the ranks stay in step (one set of weights, a checkpoint both resume)."""
    result = run_ranks(tiny_model_dir, tmp_path, "ddp", "grpo", overrides=("actor.shuffle_samples=true",))
    assert result["resumed_equal"] and result["version"] == NUM_DP_BUFFERS
    trained = load_file(str(tmp_path / "weights.safetensors"))
    initial = dict(TrainerCore(trainer_config(), model_dir=tiny_model_dir).named_weights())
    assert any(not torch.equal(trained[name], initial[name]) for name in initial)
    assert all(abs(m["actor/grad_norm"]) < float("inf") for m in result["metrics"])
