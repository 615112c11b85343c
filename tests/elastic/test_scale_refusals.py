"""`psrl scale` refuses what it cannot do before it asks anything: an unknown run, a run that is not
running (finished, failed, starting, or whose launcher is gone) and a malformed argument, each with the
problem and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import psrl
from psrl.rundir import RunDir
from psrl.scale_request import ScaleError


def _run(tmp_path: Path, **state: object) -> RunDir:
    run = RunDir.create(tmp_path / "runs", "r1")
    run.write_state(**state)
    return run


def test_an_unknown_run_is_named_with_where_it_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(ScaleError, match=r"unknown run 'nope': no run directory there or under .*runs"):
        psrl.scale("nope", "rollout=+1", root=tmp_path / "runs")


@pytest.mark.parametrize(
    ("state", "says"),
    [
        (
            {"status": "finished", "reason": "10 training steps done"},
            r"is finished \(10 training steps done\).*--name r1",
        ),
        ({"status": "failed", "reason": "stalled"}, r"is failed \(stalled\).*Launch it again"),
        ({"status": "starting"}, "is starting: wait until it is running"),
        ({"status": "running", "launcher_pid": 2**22 + 12345}, r"its launcher \(pid \d+\) is gone.*--name r1"),
    ],
)
def test_a_run_that_is_not_running_is_refused_with_what_to_do(tmp_path: Path, state: dict, says: str) -> None:
    run = _run(tmp_path, **state)
    with pytest.raises(ScaleError, match=says):
        psrl.scale(run.path, "rollout=+1")


def test_a_malformed_argument_is_refused_before_the_run_is_looked_at(tmp_path: Path) -> None:
    with pytest.raises(ScaleError, match=r"want ROLE=\+N"):
        psrl.scale(tmp_path / "absent", "rollout+1")


def test_the_command_line_says_the_problem_on_stderr_and_exits_1(tmp_path: Path) -> None:
    run = _run(tmp_path, status="finished", reason="done")
    command = [sys.executable, "-m", "psrl.cli.main", "scale", str(run.path), "rollout=-1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert "psrl scale: run r1 is finished (done)" in done.stderr
