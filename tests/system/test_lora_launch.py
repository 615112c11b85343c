"""`psrl launch demo actor.lora.rank=8`: a LoRA run end to end on real actors. The trainer pushes adapters
only (every WeightsPushed is the adapters' bytes, far below the full weights), the rollout instances
merge each version on load, the checkpoint holds the adapters beside a merged export, every recorded
decision replays (`psrl replay --check all`), and a second launch resumes from the adapters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

import psrl
from bus.eventlog.reader import EventLogReader
from bus.messages import TrainerProgress, WeightsLoaded, WeightsPushed
from psrl.replay.runner import replay_run

# two launches and two replays: minutes on two loaded cores (make test-slow)
pytestmark = [pytest.mark.system, pytest.mark.slow, pytest.mark.timeout(900)]

EXIT_BOUND_S = 600  # far beyond a few steps on a loaded 2-core machine: a hang fails, a slow machine does not
SMALL = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "task.name=demo_short", "bus.handshake_timeout_s=120",
         "trainer.save_freq=0"]  # fmt: skip
LORA = ["actor.lora.rank=8", "actor.lora.alpha=16", "actor.lora.target_modules=[q_proj,v_proj]"]
DEMO_WEIGHTS = Path(psrl.__file__).parent / "assets" / "demo_model" / "model.safetensors"


def launch(root: Path, name: str, overrides: list[str]) -> Path:
    command = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--root", str(root), "--name", name,
               *SMALL, *LORA, *overrides]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return root / name


def messages(run: Path) -> list[object]:
    return [e.event.message for e in EventLogReader(run / "events").events()]


def test_lora_run_syncs_adapters_replays_and_resumes(tmp_path: Path) -> None:
    run = launch(tmp_path, "lora", ["trainer.total_steps=3"])
    found = messages(run)
    pushed = [m for m in found if isinstance(m, WeightsPushed)]
    adapter_bytes = 4 * 4 * 8 * (128 + 128 + 128 + 64)  # fp32; 4 layers; rank 8; q (128 -> 128), v (128 -> 64)
    assert [m.version for m in pushed] == [1, 2, 3] and {m.num_bytes for m in pushed} == {adapter_bytes}
    full_bytes = sum(t.numel() * 4 for t in load_file(str(DEMO_WEIGHTS)).values())
    assert full_bytes / adapter_bytes > 50
    loaded = {(m.instance, m.version) for m in found if isinstance(m, WeightsLoaded)}
    assert {v for _, v in loaded} >= {1, 2}, "the instances merged pushed versions"
    checkpoint = run / "checkpoints" / "step_00000003"
    assert (checkpoint / "policy_adapter" / "adapter_model.safetensors").is_file()
    assert not any("lora" in n for n in load_file(str(checkpoint / "policy" / "model.safetensors")))
    replays_fully(run)

    launch(tmp_path, "lora", ["trainer.total_steps=5"])  # the same run directory: resumes at version 3
    later = messages(run)[len(found) :]
    assert [m.version for m in later if isinstance(m, TrainerProgress)][:2] == [4, 5]
    resumed_push = [m for m in later if isinstance(m, WeightsPushed)]
    assert [m.version for m in resumed_push] == [4, 5] and {m.num_bytes for m in resumed_push} == {adapter_bytes}
    assert 3 in {m.version for m in later if isinstance(m, WeightsLoaded)}, "the resumed adapters reached the PS"
    replays_fully(run)


def replays_fully(run: Path) -> None:
    command = [sys.executable, "-m", "psrl.cli.main", "replay", str(run), "--check", "all"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for checker in replay_run(run, ["all"]).checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])
