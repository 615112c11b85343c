"""`psrl launch demo actor.lora.rank=8 engine.backend=vllm`: a LoRA run end to end with vLLM rollout
instances (marker `vllm`, `make test-vllm`). The trainer pushes adapters only, every vLLM instance loads
pushed versions through vLLM's LoRA support with no failed sync, and the run trains to its last step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import InstanceSyncFailed, TrainerProgress, WeightsLoaded, WeightsPushed
from psrl.engine.vllm_backend.availability import vllm_unavailable
from tests.system.test_lora_launch import LORA, SMALL

pytestmark = [
    pytest.mark.system,
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(vllm_unavailable() is not None, reason="needs the vllm extra (make install-vllm)"),
]

EXIT_BOUND_S = 600  # a few steps with two vLLM instances on a loaded 2-core machine: a hang fails, slowness does not
VLLM = ["engine.backend=vllm", "engine.block_size=32", "bus.handshake_timeout_s=180"]


def test_a_lora_run_with_vllm_instances_loads_every_adapter_version(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--root", str(tmp_path), "--name", "lora",
               *SMALL, *LORA, *VLLM, "trainer.total_steps=3"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    found = [e.event.message for e in EventLogReader(tmp_path / "lora" / "events").events()]
    pushed = [m for m in found if isinstance(m, WeightsPushed)]
    adapter_bytes = 4 * 4 * 8 * (128 + 128 + 128 + 64)  # fp32; 4 layers; rank 8; q (128 -> 128), v (128 -> 64)
    assert [m.version for m in pushed] == [1, 2, 3] and {m.num_bytes for m in pushed} == {adapter_bytes}
    loaded = {(m.instance, m.version) for m in found if isinstance(m, WeightsLoaded)}
    assert {instance for instance, _ in loaded} == {"rollout-0", "rollout-1"}
    assert {version for _, version in loaded} >= {1, 2}
    assert not [m for m in found if isinstance(m, InstanceSyncFailed)]
    assert [m.version for m in found if isinstance(m, TrainerProgress)][-1] == 3
