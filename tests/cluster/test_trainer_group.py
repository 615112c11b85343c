"""Data-parallel trainer ranks (gloo on CPU) that survive a rank: each of two ranks is killed once,
one at a time, in a run on this machine; the group re-forms from the PS's committed version (every
rank adopts it) and the run finishes and replays. The same across Ray nodes: test_ray_launch.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from psrl.rundir import RunDir
from tests.cluster.rank_faults import check_group_recovered, kill_ranks_one_at_a_time

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize("background_push", ["auto", "true"])  # auto: off on the CPU
def test_two_ranks_killed_one_at_a_time_re_form_and_the_run_finishes(tmp_path, background_push: str) -> None:
    steps = 24
    cmd = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--root", str(tmp_path / "runs"), "--name", "dp",
           "--quiet", "topology.n_trainer_ranks=2", f"trainer.total_steps={steps}", "trainer.save_freq=4",
           f"trainer.background_push={background_push}"]  # fmt: skip
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = RunDir(tmp_path / "runs" / "dp")
    try:
        kill_ranks_one_at_a_time(run, launcher, [1, 0])
        out, _ = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, out[-6000:]
    check_group_recovered(run.path, steps, [0, 1])
    replay = subprocess.run([sys.executable, "-m", "psrl.cli.main", "replay", str(run.path), "--check", "all"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert replay.returncode == 0, replay.stdout[-3000:]
