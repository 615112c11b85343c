"""One staleness buffer as counters per region, never as an array of slots.

Upstream keeps each buffer as a slot array laid out `[OCCUPIED][EMPTY][RESERVED]` and scans it;
the layout invariant means the counts of the three regions say everything a decision needs, so
this class keeps only the counts plus two small indexes:

* occupied prompt ids in occupancy order (the order the trainer receives them), and
* reserved prompt ids keyed by their group version, so the Occupy swap finds a reservation that
  may legally move to a later buffer in O(eta) instead of scanning the slots.
"""

from __future__ import annotations

from psrl.staleness.types import BufferCounts, BufferStatus, LedgerError


class Buffer:
    """Counters of one unconsumed buffer (B = ready entries, B' = slots)."""

    __slots__ = ("buffer_id", "num_ready", "num_reserved", "num_slots", "occupied", "reserved_by_version")

    def __init__(self, buffer_id: int, num_slots: int, num_ready: int) -> None:
        self.buffer_id = buffer_id
        self.num_slots = num_slots
        self.num_ready = num_ready
        self.num_reserved = 0
        self.occupied: dict[int, None] = {}
        self.reserved_by_version: dict[int, dict[int, None]] = {}

    # queries

    @property
    def num_occupied(self) -> int:
        return len(self.occupied)

    @property
    def num_empty(self) -> int:
        return self.num_slots - len(self.occupied) - self.num_reserved

    @property
    def is_full(self) -> bool:
        """B groups occupied: nothing more can ever land here."""
        return len(self.occupied) >= self.num_ready

    @property
    def has_room(self) -> bool:
        """An empty slot that a new reservation or occupant may take (the PENDING state)."""
        return len(self.occupied) < self.num_ready and self.num_empty > 0

    @property
    def status(self) -> BufferStatus:
        if self.is_full:
            return BufferStatus.READY_WITH_CAPACITY if self.num_empty > 0 else BufferStatus.READY
        return BufferStatus.PENDING if self.num_empty > 0 else BufferStatus.STUCK

    def counts(self) -> BufferCounts:
        return BufferCounts(self.buffer_id, len(self.occupied), self.num_reserved, self.num_empty, self.status)

    def find_movable(self, min_version: int) -> tuple[int, int] | None:
        """A reservation whose group version is >= min_version (newest first), as (prompt_id, version)."""
        for version in sorted(self.reserved_by_version, reverse=True):
            if version < min_version:
                return None
            prompt_ids = self.reserved_by_version[version]
            return next(iter(prompt_ids)), version
        return None

    def reserved_prompt_ids(self) -> list[int]:
        return [p for ids in self.reserved_by_version.values() for p in ids]

    # mutations (the ledger checks legality first; these only refuse impossible counts)

    def add_reservation(self, prompt_id: int, version: int) -> None:
        if self.num_empty <= 0:
            raise LedgerError(f"buffer {self.buffer_id} has no empty slot for a reservation of prompt {prompt_id}")
        self.reserved_by_version.setdefault(version, {})[prompt_id] = None
        self.num_reserved += 1

    def remove_reservation(self, prompt_id: int, version: int) -> None:
        ids = self.reserved_by_version.get(version)
        if ids is None or prompt_id not in ids:
            raise LedgerError(
                f"prompt {prompt_id} holds no reservation at version {version} in buffer {self.buffer_id}"
            )
        del ids[prompt_id]
        if not ids:
            del self.reserved_by_version[version]
        self.num_reserved -= 1

    def add_occupant(self, prompt_id: int) -> None:
        if not self.has_room:
            raise LedgerError(f"buffer {self.buffer_id} has no room for prompt {prompt_id}")
        self.occupied[prompt_id] = None

    def remove_occupant(self, prompt_id: int) -> None:
        if prompt_id not in self.occupied:
            raise LedgerError(f"prompt {prompt_id} does not occupy buffer {self.buffer_id}")
        del self.occupied[prompt_id]
