"""Launching a run again once it is done: `psrl launch` says so and exits; a higher total continues it.

Regression: the same command again logged "resuming version=12", started every actor and a warm
spare, then waited for a training step no one would train, until it was killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import WeightsPublished
from launch.plan import ActorSpec
from launch.process import ActorProcess
from launch.supervisor import EXIT_OK, Supervisor
from psrl.config import load_config
from psrl.launches import is_replacement, launch_of, nothing_to_do
from psrl.rundir import RunDir

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

PUBLISH_WAIT_S = 120  # for the resumed trainer's push to be logged before the coordinator is started
EXIT_BOUND_S = 60  # far beyond a few steps on a loaded 2-core machine: a hang fails, a slow machine does not
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


class CoordinatorAfterThePublish(Supervisor):
    """Starts the coordinator only once this launch's first version is in the log: the trainer's process
    started first and pushed its checkpoint's version before the coordinator could subscribe."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.specs = sorted(self.specs, key=lambda spec: spec.role == "coordinator")  # the coordinator last
        self.waited_s = 0.0

    def _start(self, spec: ActorSpec, incarnation: int, *, announce: bool = True) -> ActorProcess:
        if spec.role == "coordinator" and not is_replacement(incarnation):
            started = time.monotonic()
            while not self._published() and time.monotonic() - started < PUBLISH_WAIT_S:
                time.sleep(0.1)
            self.waited_s = time.monotonic() - started
        return super()._start(spec, incarnation, announce=announce)

    def _published(self) -> bool:
        logged = EventLogReader(self.run_dir.events).events_of({WeightsPublished.KIND}, self.log_segment)
        return any(launch_of(e.event.envelope.incarnation) == launch_of(self.incarnation_base) for e in logged)


def test_a_resumed_run_whose_coordinator_starts_after_the_checkpoint_is_published_trains_on(tmp_path: Path) -> None:
    """The coordinator finds the launch's first version in the event log (the bus brought it before the
    coordinator subscribed) and dispatches; without that it would wait for a publication that came already."""
    first = Supervisor(load_config("demo", [*SMALL, "trainer.total_steps=2"]), RunDir.create(tmp_path, "late"))
    assert first.run() == EXIT_OK, first.end_reason
    sup = CoordinatorAfterThePublish(
        load_config("demo", [*SMALL, "trainer.total_steps=3"]), RunDir.create(tmp_path, "late")
    )
    code = sup.run_within(EXIT_BOUND_S, "the resumed run did not finish (the coordinator waits?)")
    assert sup.resume.version == 2 and sup.waited_s < PUBLISH_WAIT_S, (sup.resume, sup.waited_s)
    assert code == EXIT_OK, sup.end_reason
    log = sup.run_dir.log_file("coordinator").read_text()
    assert "first version found in the event log" in log, log[-2000:]
