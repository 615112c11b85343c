"""What the coordinator counts between two steps: failed trajectories and the generation rate.

Both go into the step's metrics. Failed trajectories are split by where they failed: a session
(its environment raised, or the agent's episode could not go on) or the generation itself; the
first error of each kind travels as text with the step's metrics, so the console can show it.

The rate is the trajectories (and tokens) that finished within a trailing window, over the
window: it measures generation. Dividing a buffer's size by the time since the previous
handover would not: buffers filled ahead of the trainer are handed over moments apart, which
reads as thousands of trajectories per second.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

# the router's prefix for a trajectory whose session ended with an error (psrl.flows.router)
SESSION_FAILED_PREFIX = "session failed: "
RATE_WINDOW_S = 10.0


def failure_kind(error: str) -> str:
    """'session' for a session's failure (environment or agent), 'generation' for any other."""
    return "session" if error.startswith(SESSION_FAILED_PREFIX) else "generation"


@dataclass
class FailureCounts:
    """Failed trajectories by kind since the last `take`, with the first error of each kind."""

    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def failed(self, error: str) -> None:
        kind = failure_kind(error)
        self.counts[kind] += 1
        self.first.setdefault(kind, error.removeprefix(SESSION_FAILED_PREFIX) or "no error text")

    def take(self) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics, notes): `<kind>/num_failed` for every kind (zeros included, so a plot has every
        step) and `<kind>/first_error` for the kinds that failed."""
        values = {f"{kind}/num_failed": float(self.counts[kind]) for kind in ("session", "generation")}
        notes = {f"{kind}/first_error": text for kind, text in self.first.items()}
        self.counts.clear()
        self.first.clear()
        return values, notes


@dataclass
class RateMeter:
    """Finished trajectories per second over the last `window_s` (or since `started`, when shorter)."""

    started: float
    window_s: float = RATE_WINDOW_S
    finished: deque[tuple[float, int]] = field(default_factory=deque)  # (time, response tokens)

    def add(self, now: float, num_tokens: int) -> None:
        self.finished.append((now, num_tokens))

    def rates(self, now: float) -> tuple[float, float]:
        """(trajectories per second, tokens per second) at ``now``."""
        since = max(now - self.window_s, self.started)
        while self.finished and self.finished[0][0] < since:
            self.finished.popleft()
        span = max(now - since, 1e-6)
        return len(self.finished) / span, sum(tokens for _, tokens in self.finished) / span
