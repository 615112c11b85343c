"""Failing rewards are loud: `psrl launch` with a reward function that fails.

Regression: a reward that raised on every call was silent; the run exited 0 and said "finished"
with reward 0.000 on every step, the error only in logs/coordinator.log.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from psrl.report.metrics_file import read_metrics_file
from psrl.rewards.failures import step_failures

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

EXIT_BOUND_S = 600  # far beyond a few steps on a loaded 2-core machine: a hang fails, a slow machine does not
SMALL = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "task.name=demo_short", "bus.handshake_timeout_s=120"]

ALWAYS = """
def score(response):
    raise ValueError("reward service down")
"""
FIXED = """
def score(response):
    return 1.0
"""
# every other call fails: no two steps in a row can be over half failed, however the calls fall
HALF = """
import itertools, threading
calls, lock = itertools.count(), threading.Lock()

def score(response):
    with lock:
        n = next(calls)
    if n % 2:
        raise ConnectionError("judge busy")
    return 1.0
"""


def launch(tmp_path: Path, source: str, steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
    reward = tmp_path / "my_reward.py"
    reward.write_text(source)
    command = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--root", str(tmp_path), "--name", "run",
               f"trainer.total_steps={steps}", f"reward.function={reward}:score", *SMALL, *extra]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=EXIT_BOUND_S, check=False)


def coordinator_steps(run: Path) -> list[dict[str, float]]:
    records, problems = read_metrics_file(run / "metrics.jsonl")
    assert not problems
    return [r.values for r in records if r.sender == "coordinator" and "reward/mean" in r.values]


def test_a_reward_that_always_raises_stops_the_run_after_the_patience(tmp_path: Path) -> None:
    done = launch(tmp_path, ALWAYS, steps=20)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "warning: step 1:" in out and "ValueError: reward service down" in out
    assert "reward calls failed on 3 steps in a row" in out and "reward.error_patience" in out
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    assert state["status"] == "failed" and "reward calls failed" in state["reason"]
    # a step's counts are the calls made since the last step's: a buffer whose trajectories were all
    # scored before the previous handover has none, and the watch skips it
    failures = [step_failures(s) for s in coordinator_steps(tmp_path / "run")]
    with_calls = [f for f in failures if f.num_calls]
    assert len(failures) < 20 and len(with_calls) >= 3 and all(f.fraction == 1.0 for f in with_calls)


def test_a_reward_failing_half_the_time_warns_and_the_run_completes(tmp_path: Path) -> None:
    done = launch(tmp_path, HALF, steps=6)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "reward calls failed" in out and "ConnectionError: judge busy" in out
    assert "run run finished: 6 training steps done" in out
    failed = [step_failures(s) for s in coordinator_steps(tmp_path / "run")]
    assert sum(f.num_failed for f in failed) > 0
    assert not any(a.fraction > 0.5 and b.fraction > 0.5 for a, b in itertools.pairwise(failed))


def test_a_run_stopped_for_failing_rewards_keeps_its_training_and_resumes(tmp_path: Path) -> None:
    # at the fifth buffer's handover the dispatch throttle (staleness 2) has waited for version 3: by
    # then the trainer has trained three steps, which the stop must not lose
    stopped = launch(tmp_path, ALWAYS, 20, "psrl.staleness=2", "reward.error_patience=5", "trainer.save_freq=0")
    assert stopped.returncode == 1, (stopped.stdout + stopped.stderr)[-3000:]
    assert "reward calls failed on 5 steps in a row" in stopped.stdout
    checkpoints = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert checkpoints, "no checkpoint on the way out"
    version = int(checkpoints[-1].name.removeprefix("step_"))
    assert version >= 3
    fixed = launch(tmp_path, FIXED, version + 1, "psrl.staleness=2")
    out = fixed.stdout + fixed.stderr
    assert fixed.returncode == 0, out[-3000:]
    assert "resuming" in out and f"version={version}" in out and f"{version + 1} training steps done" in out
