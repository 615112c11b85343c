"""The trainer's CPU threads: a fixed count reaches the trainer; auto stays within the host's cores."""

from __future__ import annotations

import os

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import Metrics
from launch.supervisor import Supervisor
from psrl.config import load_config
from psrl.rundir import RunDir

pytestmark = pytest.mark.system

SMALL = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "task.name=demo_short", "trainer.total_steps=3",
         "bus.handshake_timeout_s=120"]  # fmt: skip


def _threads_per_version(tmp_path, setting: str) -> list[float]:
    config = load_config("demo", [*SMALL, f"topology.trainer_threads={setting}"])
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", f"threads-{setting}"))
    assert sup.run() == 0, sup.end_reason
    events = (e.event.message for e in EventLogReader(sup.run_dir.events).events())
    return [
        m.values["perf/trainer_threads"]
        for m in events
        if isinstance(m, Metrics) and "perf/trainer_threads" in m.values
    ]


@pytest.mark.parametrize("setting", ["2", "auto"])
def test_the_trainer_computes_with_its_threads(tmp_path, setting: str) -> None:
    threads = _threads_per_version(tmp_path, setting)
    assert len(threads) == 3, threads  # one per version
    if setting == "auto":
        assert all(1 <= t <= len(os.sched_getaffinity(0)) for t in threads), threads
    else:
        assert threads == [2.0, 2.0, 2.0]
