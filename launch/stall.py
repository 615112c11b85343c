"""The supervisor's stall watch: the events it hears fed to ``psrl.reliability.stall``, failed pulls on the console."""

from __future__ import annotations

from typing import Any

from bus.messages import (
    InstanceStatus,
    InstanceSyncFailed,
    PullRetrying,
    RouterStatus,
    TrainerProgress,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Event
from psrl.config import Config
from psrl.reliability.stall import Diagnosis, InstanceProgress, RouterView, StallFacts, StallWatch

# what the watch needs beyond the supervisor's own subscriptions
SUBSCRIPTIONS = ("router.status", "wt.published", "wt.loaded", "wt.pull_retry", "wt.sync_failed")


class RunStallWatch:
    def __init__(self, config: Config, log: Any, trained_version: int, now: float) -> None:
        facts = StallFacts(config.psrl.staleness, trained_version=trained_version)
        self.watch = StallWatch(config.run.stall_timeout_s, facts, now, total_steps=config.trainer.total_steps)
        self.log = log

    def observe(self, event: Event[Any], now: float) -> None:
        msg, facts = event.message, self.watch.facts
        if isinstance(msg, TrainerProgress):
            self.watch.trained(msg.version, now)
        elif isinstance(msg, RouterStatus):
            servable = sum(msg.servable_without_new_entry) + sum(msg.servable_with_new_entry)
            facts.router = RouterView(
                msg.num_queued, msg.num_inflight, tuple(msg.versions), servable, msg.next_buffer, now
            )
        elif isinstance(msg, InstanceStatus):
            facts.instances[msg.instance] = InstanceProgress(msg.weight_version, msg.num_running, now)
        elif isinstance(msg, WeightsPublished):
            self.watch.published(msg.version)
        elif isinstance(msg, WeightsLoaded):
            self.watch.loaded(msg.instance)
        elif isinstance(msg, PullRetrying | InstanceSyncFailed):
            self._pull_failed(msg)

    def _pull_failed(self, msg: PullRetrying | InstanceSyncFailed) -> None:
        if isinstance(msg, PullRetrying):
            actor, what = msg.actor, f"attempt {msg.attempt} of {msg.max_attempts}"
            self.log.warning("weight pull failed; retrying", actor=actor, version=msg.version, attempt=what,
                             reason=msg.reason)  # fmt: skip
        else:
            actor = msg.instance
            self.log.warning("weight sync failed; the instance takes no work until a sync succeeds",
                             actor=actor, version=msg.version, reason=msg.reason)  # fmt: skip
        self.watch.pull_failed(actor, msg.reason)

    def check(self, now: float) -> tuple[Diagnosis, str, float] | None:
        return self.watch.check(now)
