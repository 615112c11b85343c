"""The timeline summary of a recorded run: span, events per kind and per actor, gaps, bad records."""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from bus.eventlog import LogProblem
from bus.gaps import GapTracker
from bus.schema import Event


@dataclass(frozen=True)
class QuietGap:
    """A stretch of wall time in which nobody published anything."""

    seconds: float
    start_wall_ns: int
    end_wall_ns: int
    after_event_id: str


@dataclass
class ActorSummary:
    num_events: int = 0
    first_wall_ns: int = 0
    last_wall_ns: int = 0
    last_seq: int = 0
    num_missing: int = 0
    num_late: int = 0


@dataclass
class TimelineSummary:
    num_events: int
    first_wall_ns: int | None
    last_wall_ns: int | None
    events_per_kind: dict[str, int]
    actors: dict[str, ActorSummary]
    quiet_gaps: list[QuietGap]
    problems: list[LogProblem] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        if self.first_wall_ns is None or self.last_wall_ns is None:
            return 0.0
        return (self.last_wall_ns - self.first_wall_ns) / 1e9

    @property
    def num_missing(self) -> int:
        return sum(a.num_missing for a in self.actors.values())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["span_s"] = self.span_s
        data["num_missing"] = self.num_missing
        return data


class TimelineBuilder:
    """Accumulates the summary one event at a time, in log order (constant memory per actor)."""

    def __init__(self, min_gap_s: float = 1.0, num_gaps: int = 5) -> None:
        self.min_gap_ns = int(min_gap_s * 1e9)
        self.num_gaps = num_gaps
        self.kinds: Counter[str] = Counter()
        self.actors: dict[str, ActorSummary] = {}
        self.seqs = GapTracker(from_first_seen=False)
        self.num_events = 0
        self.first_wall_ns: int | None = None
        self.latest_wall_ns: int | None = None
        self.latest_event_id = ""
        self._gaps: list[tuple[int, int, int, str]] = []  # min-heap of the longest gaps

    def observe(self, event: Event[Any]) -> None:
        env = event.envelope
        self.num_events += 1
        self.kinds[env.kind] += 1
        actor = self.actors.get(env.actor)
        if actor is None:
            actor = self.actors[env.actor] = ActorSummary(first_wall_ns=env.wall_ns)
        actor.num_events += 1
        actor.last_wall_ns = max(actor.last_wall_ns, env.wall_ns)
        actor.last_seq = max(actor.last_seq, env.seq)
        self.seqs.observe(env)
        self._observe_time(env.wall_ns, env.event_id)

    def _observe_time(self, wall_ns: int, event_id: str) -> None:
        if self.first_wall_ns is None or wall_ns < self.first_wall_ns:
            self.first_wall_ns = wall_ns
        if self.latest_wall_ns is not None and wall_ns - self.latest_wall_ns >= self.min_gap_ns:
            item = (wall_ns - self.latest_wall_ns, self.latest_wall_ns, wall_ns, self.latest_event_id)
            if len(self._gaps) < self.num_gaps:
                heapq.heappush(self._gaps, item)
            else:
                heapq.heappushpop(self._gaps, item)
        if self.latest_wall_ns is None or wall_ns >= self.latest_wall_ns:
            self.latest_wall_ns = wall_ns
            self.latest_event_id = event_id

    def finish(self, problems: list[LogProblem]) -> TimelineSummary:
        for (sender, incarnation), state in self.seqs.senders.items():
            actor = self.actors[f"{sender}#{incarnation}"]
            actor.num_missing = state.num_missing
            actor.num_late = state.num_late
        gaps = [QuietGap(d / 1e9, start, end, after) for d, start, end, after in sorted(self._gaps, reverse=True)]
        return TimelineSummary(
            num_events=self.num_events,
            first_wall_ns=self.first_wall_ns,
            last_wall_ns=self.latest_wall_ns,
            events_per_kind=dict(self.kinds.most_common()),
            actors=dict(sorted(self.actors.items())),
            quiet_gaps=gaps,
            problems=list(problems),
        )
