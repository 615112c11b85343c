"""A trainer rank that gets a newer buffer before older ones trains them all, in order.

A replacement rank's link delivers what was queued for the dead rank first: a buffer the coordinator
handed over just before it heard of the death, then the older buffers it re-sends. The rank holds the
newer buffer's chunks until it has trained the ones before it.
"""

from __future__ import annotations

from bus.messages import TrainData
from psrl.config import load_config
from tests.flows.restart_harness import RestartableRun

CONFIG = ["psrl.staleness_buffer_entries=4", "psrl.rollout_n=4", "actor.ppo_mini_batch_size=4",
          "psrl.staleness=2", "trainer.total_steps=6"]  # fmt: skip


def test_buffers_handed_over_newest_first_are_trained_in_order() -> None:
    run = RestartableRun(load_config("demo", CONFIG))
    run.start()
    run.rounds_until(lambda: len(run.record.progress) >= 1, 20_000)
    backlog = run.stall_trainer()
    run.rounds_until(lambda: len({m.buffer for m in backlog.messages if isinstance(m, TrainData)}) >= 2, 20_000)
    first = min(m.buffer for m in backlog.messages if isinstance(m, TrainData))
    backlog.messages.sort(key=lambda m: -m.buffer if isinstance(m, TrainData) else 0)  # the newest first
    assert backlog.messages[0].buffer > first
    run.release_trainer()
    assert run.trainer.core.version >= first + 2, "both buffers trained once the older one arrived"
    assert not run.trainer.ahead
    run.rounds_until(lambda: run.record.finished is not None, 20_000)
    assert [p.version for p in run.record.progress] == list(range(1, 7))
