"""What the supervisor does when an actor dies (pure decision code, no I/O).

Rollout instances and PS shards are stateless enough to restart: an instance re-pulls weights
and its requests are re-routed from their tokens; a shard is refilled before its version is
published. The trainer restarts from its last checkpoint. The router rebuilds its staleness ledger
and its trajectories from the event log (``psrl.flows.router_recovery``). The coordinator owns the
run's progress (the dataset cursor, the groups and what the trainer was handed) and re-runs itself
on its logged inputs (``psrl.flows.coordinator_recovery``). The logger restarts (the log is
append-only and segmented).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class RestartVerdict(str, Enum):
    RESTART = "restart"
    END_RUN = "end_run"
    IGNORE = "ignore"  # exited as asked (shutdown) or after the run finished


RESTARTABLE = {"rollout", "ps", "trainer", "logger", "session", "router", "coordinator"}


@dataclass
class RestartPolicy:
    """Restart at most ``max_restarts`` times per actor within ``window_s`` seconds."""

    max_restarts: int = 5
    window_s: float = 300.0
    _history: dict[str, list[float]] = field(default_factory=dict)

    def decide(self, actor: str, role: str, now: float, *, shutting_down: bool) -> tuple[RestartVerdict, str]:
        if shutting_down:
            return RestartVerdict.IGNORE, "run is shutting down"
        if role not in RESTARTABLE:
            return RestartVerdict.END_RUN, f"{actor} has no restart policy for role {role!r}"
        recent = [t for t in self._history.get(actor, []) if now - t <= self.window_s]
        if len(recent) >= self.max_restarts:
            return RestartVerdict.END_RUN, f"{actor} died {len(recent)} times within {self.window_s:.0f} s"
        self._history[actor] = [*recent, now]
        return RestartVerdict.RESTART, f"restart {len(recent) + 1} of {self.max_restarts}"
