"""Launching a run again once it is done: `psrl launch` says so and exits; a higher total continues it.

Regression: the same command again logged "resuming version=12", started every actor and a warm
spare, then waited for a training step no one would train, until it was killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from psrl.launches import nothing_to_do

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

EXIT_BOUND_S = 600  # far beyond a few steps on a loaded 2-core machine: a hang fails, a slow machine does not
SMALL = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "task.name=demo_short", "bus.handshake_timeout_s=120",
         "trainer.save_freq=0"]  # fmt: skip


def launch(root: Path, steps: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--root", str(root), "--name", "again",
               f"trainer.total_steps={steps}", *SMALL]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)


def test_a_finished_run_launched_again_exits_at_once_and_a_higher_total_continues(tmp_path: Path) -> None:
    first = launch(tmp_path, 2)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    state = tmp_path / "again" / "run.json"
    assert json.loads(state.read_text())["launches"] == 1

    again = launch(tmp_path, 2)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert "already did its 2 training steps" in out and "higher trainer.total_steps" in out
    assert "started" not in out and json.loads(state.read_text())["launches"] == 1  # no actor was started

    more = launch(tmp_path, 3)
    out = more.stdout + more.stderr
    assert more.returncode == 0, out[-3000:]
    assert "resuming" in out and "3 training steps done" in out
    assert json.loads(state.read_text())["launches"] == 2


@pytest.mark.parametrize(
    ("trained", "total", "done"), [(0, 12, False), (11, 12, False), (12, 12, True), (20, 12, True)]
)
def test_nothing_to_do_once_the_checkpoint_holds_the_total(trained: int, total: int, done: bool) -> None:
    message = nothing_to_do("X", trained, total)
    assert (message is not None) == done
    if message is not None:
        assert f"already did its {trained} training steps" in message and "trainer.total_steps=" in message
