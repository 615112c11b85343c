"""The simulator's clock: a heap of timed callbacks, run in time order (FIFO among equal times)."""

from __future__ import annotations

import heapq
from collections.abc import Callable

Callback = Callable[[float], None]


class SimulationError(RuntimeError):
    """The simulated run cannot go on (it stalled, or hit its time limit)."""


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callback]] = []
        self._seq = 0
        self.now = 0.0
        self.num_processed = 0

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, time: float, callback: Callback) -> None:
        """Run ``callback(time)`` at ``time`` (never earlier than now)."""
        time = max(time, self.now)
        heapq.heappush(self._heap, (time, self._seq, callback))
        self._seq += 1

    def run_next(self) -> bool:
        """Run the earliest callback; False when none is left."""
        if not self._heap:
            return False
        time, _, callback = heapq.heappop(self._heap)
        self.now = time
        self.num_processed += 1
        callback(time)
        return True
