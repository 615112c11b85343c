"""Counting dropped messages: per reason, logged sparsely so a flood cannot flood the log."""

from __future__ import annotations

import structlog

from bus.errors import DecodeError, DropReason


class DropCounter:
    """Counts messages a receiver dropped, by reason.

    The 1st, 10th, 100th, ... drop of each reason is logged (with the latest detail), so a
    receiver under a storm of bad frames spends its time counting, not writing log lines.
    """

    def __init__(self, receiver: str) -> None:
        self.receiver = receiver
        self.counts: dict[DropReason, int] = dict.fromkeys(DropReason, 0)
        self._log = structlog.get_logger("bus.drops").bind(receiver=receiver)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, error: DecodeError) -> None:
        count = self.counts[error.reason] + 1
        self.counts[error.reason] = count
        if is_sparse_log_point(count):
            self._log.warning("dropped message", reason=error.reason.value, count=count, detail=error.detail[:200])

    def as_dict(self) -> dict[str, int]:
        return {reason.value: count for reason, count in self.counts.items()}


def is_sparse_log_point(count: int) -> bool:
    """True for the 1st, 10th, 100th, ... occurrence: where a counter worth a log line logs one."""
    while count % 10 == 0:
        count //= 10
    return count == 1
