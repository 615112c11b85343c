"""LoRA under data parallelism, two real gloo processes (DDP and FSDP2): the adapters match one process
on the same data, and the collective checkpoint resumes on both ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from psrl.trainer import TrainerCore

from .lora_dp_worker import LORA
from .test_data_parallel import free_port
from .trainer_helpers import NUM_DP_BUFFERS, make_buffer, trainer_config

WORKER = Path(__file__).parent / "lora_dp_worker.py"
pytestmark = pytest.mark.slow  # two process pairs, each importing torch and transformers: about a minute each


def run_ranks(model_dir: Path, out_dir: Path, strategy: str) -> dict[str, bool]:
    port = free_port()
    processes = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
        command = [sys.executable, str(WORKER), str(model_dir), str(out_dir), strategy]
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [process.communicate(timeout=240)[0].decode(errors="replace") for process in processes]
    for rank, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank} failed:\n{output[-3000:]}"
    return json.loads((out_dir / "result.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_lora_ranks_match_one_process(tiny_model_dir: Path, tmp_path: Path, strategy: str) -> None:
    result = run_ranks(tiny_model_dir, tmp_path, strategy)
    distributed = load_file(str(tmp_path / "adapters.safetensors"))
    single = TrainerCore(trainer_config(LORA), model_dir=tiny_model_dir)
    for buffer_id in range(NUM_DP_BUFFERS):
        single.train_buffer(buffer_id, make_buffer(buffer_id))
    expected = dict(single.named_weights())
    assert distributed.keys() == expected.keys() and all(".lora_" in name for name in expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(distributed[name], tensor, atol=2e-5, rtol=1e-4)
    assert result["resumed_equal"]
