"""Which silent actors the supervisor declares dead (pure decision code, no I/O).

An actor whose heartbeats stop for ``limit_s`` (bus.heartbeat_interval_ms x bus.heartbeat_misses)
is hung or gone. Heartbeats come from a thread of their own, so a long step does not silence
them; what silences every actor at once is the machine (a memory-reclaim or I/O stall, cores
oversubscribed by other work) or the supervisor itself not running. Measured on a 2-core machine
at load 20: every actor's heartbeats, idle parameter-server shards included, paused 2-2.7 s
together, and the router and coordinator were killed, which ended the run. So when at least half
of the watched actors are late together (silent for more than half the limit), or the
supervisor's own watch loop was held off that long, the silence is treated as a stall of the
machine and gets ``stall_factor`` times the limit. A single hung actor (SIGSTOP) is still
declared dead after ``limit_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Liveness:
    limit_s: float
    stall_factor: float = 4.0

    def is_machine_stall(self, silences: Mapping[str, float], watcher_gap_s: float = 0.0) -> bool:
        """Most actors late at once, or the watcher itself late: the silence says nothing about one actor."""
        late = sum(1 for silent_s in silences.values() if silent_s > self.limit_s / 2)
        return watcher_gap_s > self.limit_s / 2 or (late >= 2 and 2 * late >= len(silences))

    def dead(self, silences: Mapping[str, float], watcher_gap_s: float = 0.0) -> list[str]:
        """Actors (by name, from the time since each one's last heartbeat) to declare dead now."""
        limit = self.limit_s * (self.stall_factor if self.is_machine_stall(silences, watcher_gap_s) else 1.0)
        return [name for name, silent_s in silences.items() if silent_s > limit]
