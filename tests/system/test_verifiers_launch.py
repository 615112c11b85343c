"""verifiers environments through the real launcher: a SingleTurnEnv and a MultiTurnEnv (examples/verifiers)
train a few steps on the bundled demo model, each session being the environment's own rollout through
the session gateway, to the run's exit; then `psrl replay --check all` must agree with every recorded
decision."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import SessionEnd
from psrl.tasks.verifiers_source import INSTALL
from tests.system.launch_helpers import assert_replay_agrees

pytest.importorskip("verifiers", reason=f"needs the extra: {INSTALL}")
pytestmark = [pytest.mark.verifiers, pytest.mark.system]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verifiers"
# far beyond a few steps' run on a loaded 2-core machine: a hang fails, a slow machine does not
EXIT_BOUND_S = 900


@pytest.mark.timeout(2 * EXIT_BOUND_S)
@pytest.mark.parametrize(("loader", "turns"), [("load_single", 1), ("load_retry", 3)])
def test_a_verifiers_environment_trains_and_replays(loader: str, turns: int, tmp_path: Path) -> None:
    settings = [f"task.name=verifiers:{EXAMPLE / 'sum_env.py'}:{loader}", "trainer.total_steps=3",
                "topology.warm_spares=0"]  # fmt: skip
    command = [sys.executable, "-m", "psrl.cli.main", "launch", str(EXAMPLE / "config.yaml"), "--quiet",
               "--root", str(tmp_path), "--name", "run", *settings]  # fmt: skip
    env = {"PSRL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False,
                          env={**os.environ, **env})  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "run"
    ends = [e.event.message for e in EventLogReader(run / "events").events() if isinstance(e.event.message, SessionEnd)]
    finished = [m for m in ends if not m.error]
    assert finished and len(finished) >= 0.9 * len(ends), [m.error for m in ends if m.error][:3]
    # the retry env answers every wrong answer, so its sessions take its max_turns (3) unless solved
    assert max(m.num_turns for m in finished) == turns
    assert any(m.reward > 0 for m in finished)  # the rubric's partial credit reached the sessions
    assert_replay_agrees(run)
