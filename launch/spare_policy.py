"""Which warm spare becomes a dead actor, and when to start another (pure decision code, no I/O).

A warm spare (`actors.spare`) is an idle process per host that has already imported torch and
the actor modules; a replacement that becomes one serves after its own setup only. The rules:

- a replacement takes the oldest ready spare on its host; none ready (or warming still), or an
  actor that needs a fresh process (a library preloaded before the interpreter starts), starts
  cold as before;
- spares are started only while the run is settled (every actor serving, the run not stopping),
  so a spare's imports never compete with a run that is starting or recovering, and one at a time
  per host, up to ``per_host``;
- a spare that dies before it is used counts against its host; after ``max_failures`` in a row
  (a broken import, say) the host gets no more spares and replacements there start cold;
- a spare still warming after ``warmup_timeout_s`` is retired (and counts as a failure).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpareInfo:
    """What the policy sees of one spare process."""

    spare_id: int  # increasing with the start time
    host: str
    is_ready: bool  # imports done, waiting for an assignment
    started_at: float  # monotonic seconds


@dataclass
class SparePolicy:
    per_host: int
    max_failures: int = 3
    warmup_timeout_s: float = 300.0
    _failures: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.per_host < 0:
            raise ValueError(f"topology.warm_spares must be >= 0, got {self.per_host}")

    def pick(self, spares: Iterable[SpareInfo], host: str, *, needs_fresh_process: bool = False) -> int | None:
        """The spare that becomes a dead actor on ``host``; None: start the actor cold."""
        if needs_fresh_process:
            return None
        ready = [s.spare_id for s in spares if s.host == host and s.is_ready]
        return min(ready, default=None)

    def hosts_to_fill(self, spares: Sequence[SpareInfo], hosts: Iterable[str], *, run_settled: bool) -> list[str]:
        """Hosts that get one more spare now."""
        if not run_settled or self.per_host == 0:
            return []
        wanted = []
        for host in hosts:
            mine = [s for s in spares if s.host == host]
            warming = any(not s.is_ready for s in mine)
            if len(mine) < self.per_host and not warming and not self.is_given_up(host):
                wanted.append(host)
        return wanted

    def overdue(self, spares: Iterable[SpareInfo], now: float) -> list[int]:
        """Spares warming for longer than ``warmup_timeout_s``: to retire."""
        return [s.spare_id for s in spares if not s.is_ready and now - s.started_at > self.warmup_timeout_s]

    def is_full(self, spares: Sequence[SpareInfo], hosts: Iterable[str]) -> bool:
        """Every host has all the ready spares it will get (a host given up on has none to wait for)."""
        return all(
            self.is_given_up(host) or sum(1 for s in spares if s.host == host and s.is_ready) >= self.per_host
            for host in hosts
        )

    def on_ready(self, host: str) -> None:
        self._failures[host] = 0

    def on_failed(self, host: str) -> None:
        self._failures[host] = self._failures.get(host, 0) + 1

    def is_given_up(self, host: str) -> bool:
        return self._failures.get(host, 0) >= self.max_failures
