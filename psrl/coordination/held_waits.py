"""How long hung sessions' ready turns waited for their continue (ThunderAgent's cost in latency).

A turn that becomes ready while its session is hung waits for a later tick to continue the
session; that wait adds to the turn's time to first token. The most recent waits are kept (a
bounded window) for quantiles, with the count, sum and maximum over the whole run.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW = 65_536  # waits kept for quantiles (a long run's memory stays bounded)


class HeldWaits:
    def __init__(self, window: int = WINDOW) -> None:
        self.recent: deque[float] = deque(maxlen=window)
        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0

    def add(self, wait_s: float) -> None:
        self.recent.append(wait_s)
        self.count += 1
        self.total_s += wait_s
        self.max_s = max(self.max_s, wait_s)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the recent waits (nearest rank); nan without any."""
        if not self.recent:
            return math.nan
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
