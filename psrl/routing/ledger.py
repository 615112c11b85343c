"""The staleness ledger as routing sees it.

The ledger (Reserve / Occupy / Consume) is owned elsewhere; worker selection only asks the
questions below, synchronously and locally, so the per-request path never waits on the network.
"""

from __future__ import annotations

from typing import Protocol


class LedgerQueries(Protocol):
    def can_reserve(self, prompt_id: int, version: int) -> bool:
        """Could a trajectory of this prompt started at ``version`` still land in some buffer?"""
        ...

    def can_reserve_without_new_entry(self, prompt_id: int, version: int) -> bool:
        """Could it join the prompt group's existing entry (no new reservation)?"""
        ...

    def reserve_indicator(self, prompt_id: int, version: int) -> float:
        """Placement preference: -inf joins an existing entry, -b a new entry in buffer b, +inf impossible."""
        ...

    def reserve(self, prompt_id: int, child: int, version: int, instance: str) -> int:
        """Reserve a slot for this child at ``version`` on ``instance``; returns the buffer id."""
        ...

    def has_group(self, prompt_id: int) -> bool:
        """Does the ledger hold a group of this prompt (that a refused child may later join)?"""
        ...

    def room_signature(self) -> tuple[int, frozenset[int]]:
        """The next buffer to consume and the buffers without room for new groups: new-group
        reservations can only become possible when this changes (see ``RouterCore``)."""
        ...
