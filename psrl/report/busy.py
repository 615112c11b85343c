"""How rollout instances spent the time between two step lines: generating, syncing weights, idle.

The figure is time-weighted: the time from one status report of an instance to its next one
counts in the state the first report gave. Counting reports instead (the share of reports with
a running request) reads low: an instance sends no report while its engine is inside a decode
step, and sends the reports it owes in a burst afterwards, all of them idle.
"""

from __future__ import annotations

from dataclasses import dataclass

GENERATING, SYNCING, IDLE = "generating", "syncing", "idle"


@dataclass
class InstanceTime:
    """Seconds in each state since the last step line."""

    generating: float = 0.0
    syncing: float = 0.0
    idle: float = 0.0

    @property
    def total(self) -> float:
        return self.generating + self.syncing + self.idle

    @property
    def busy(self) -> float:
        """The share of the time spent generating (0 when no time was seen)."""
        return self.generating / self.total if self.total > 0 else 0.0


def state_of(num_running: int, is_paused: bool) -> str:
    if num_running > 0:
        return GENERATING
    return SYNCING if is_paused else IDLE


class BusyClock:
    """Accumulates each instance's time per state from its status reports (its own clock, in seconds)."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, str]] = {}
        self.times: dict[str, InstanceTime] = {}

    def report(self, instance: str, at_s: float, num_running: int, is_paused: bool) -> None:
        previous = self.last.get(instance)
        self.last[instance] = (at_s, state_of(num_running, is_paused))
        if previous is None or at_s <= previous[0]:
            self.times.setdefault(instance, InstanceTime())
            return
        since, state = previous
        spent = self.times.setdefault(instance, InstanceTime())
        setattr(spent, state, getattr(spent, state) + at_s - since)

    def take(self) -> dict[str, InstanceTime]:
        """The time since the last call, per instance (the states carry on into the next interval)."""
        taken, self.times = self.times, {name: InstanceTime() for name in self.times}
        return taken
