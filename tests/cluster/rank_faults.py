"""Killing data-parallel trainer ranks of a running run one at a time, and what the run must show after."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from bus.messages import ActorRestarted, Hello, TrainerProgress
from psrl.rundir import RunDir
from tests.system.launch_helpers import logged_events


def latest_version(run: RunDir) -> int:
    if not run.events.exists():
        return 0
    seen = [e.message.version for e in logged_events(run) if isinstance(e.message, TrainerProgress)]
    return max(seen, default=0)


def wait_for_version(run: RunDir, launcher: subprocess.Popen[str], version: int, timeout_s: float = 300) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert launcher.poll() is None, f"the run ended before version {version}"
        now = latest_version(run)
        if now >= version:
            return now
        time.sleep(0.5)
    raise AssertionError(f"no version {version} within {timeout_s} s")


def rank_pid(run: RunDir, rank: int) -> int:
    """The pid the rank's latest incarnation announced (its Hello)."""
    hellos = [e for e in logged_events(run) if isinstance(e.message, Hello) and e.envelope.sender == f"trainer-{rank}"]
    return max(hellos, key=lambda e: e.envelope.incarnation).message.pid


def kill_ranks_one_at_a_time(run: RunDir, launcher: subprocess.Popen[str], ranks: list[int], gap: int = 3) -> list[int]:
    """SIGKILL each rank once the run trained ``gap`` versions past the previous kill (the group re-formed
    and trains again); the versions at which they were killed."""
    killed_at = []
    version = wait_for_version(run, launcher, gap)
    for rank in ranks:
        killed_at.append(version)
        os.kill(rank_pid(run, rank), signal.SIGKILL)
        version = wait_for_version(run, launcher, version + gap)
    return killed_at


def check_group_recovered(run_dir: Path, steps: int, ranks: list[int]) -> None:
    run = RunDir(run_dir)
    events = logged_events(run)
    assert latest_version(run) == steps
    restarted = {e.message.actor for e in events if isinstance(e.message, ActorRestarted)}
    assert {f"trainer-{r}" for r in ranks} <= restarted, restarted
    logs = "".join((run.path / "logs" / f"trainer-{r}.log").read_text() for r in ranks)
    # the re-formed group went on from the PS's committed version: from a checkpoint of that version
    # (a background write can land as a peer dies) or by catching up from an older one
    assert "continuing from the committed version" in logs or "resumed" in logs
    # ... and so no version was pushed twice (rank 0 pushes; its log holds every incarnation's)
    rank0 = (run.path / "logs" / "trainer-0.log").read_text()
    pushed = [int(v) for v in re.findall(r"ps\.pushed\b.*?\bversion=(\d+)", rank0)]
    assert pushed == sorted(set(pushed)) and pushed[-1] == steps, pushed
