"""A reasoning-gym task through the real launcher: a few steps on the bundled demo model with held-out
evaluation, to its exit, then `psrl replay --check all` must agree with every recorded decision."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import EvalResult
from psrl.tasks.reasoning_gym import INSTALL
from tests.system.launch_helpers import assert_replay_agrees

pytest.importorskip("reasoning_gym", reason=f"needs the extra: {INSTALL}")
pytestmark = [pytest.mark.reasoning_gym, pytest.mark.system]

# far beyond a few steps' run on a loaded 2-core machine: a hang fails, a slow machine does not
EXIT_BOUND_S = 900
SETTINGS = [
    "task.name=reasoning_gym:composite",
    "task.kwargs={size: 500, datasets: [{name: basic_arithmetic, weight: 2, config: {max_digits: 1, max_terms: 2}}, "
    "{name: gcd, weight: 1, config: {max_value: 99}}]}",
    "task.answer_tag=null",  # the demo model answers digits, never tags
    "task.max_response_length=8",
    "trainer.total_steps=3",
    "trainer.eval_interval=2",
    "eval.num_prompts=8",
    "eval.k=0",
]


@pytest.mark.timeout(EXIT_BOUND_S + 300)
def test_a_composite_reasoning_gym_task_trains_evaluates_and_replays(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--quiet", "--root", str(tmp_path),
               "--name", "run", *SETTINGS]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "run"
    evaluated = [e for e in EventLogReader(run / "events").events() if isinstance(e.event.message, EvalResult)]
    assert len(evaluated) >= 8  # at least one round over the held-out prompts
    assert_replay_agrees(run)
