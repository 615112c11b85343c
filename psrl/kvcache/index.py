"""Which KV blocks the offload tier holds: version-tagged keys, LRU/FIFO order, pins, a change journal.

A key is ``(weight version, chained block hash)``: the hash stands for the block's whole prefix
(psrl.kvcache.keys) and the version for the weights that computed it, so a
lookup under version N can never return an entry computed under version M. Entries of old
versions are not removed on a weight update; new entries push them out in eviction order.

Pinned keys (pin_sync transfers) are never evicted until their owner releases them. The journal
of added and removed keys is what an instance reports to the router, incrementally.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Literal

TierKey = tuple[int, int]  # (weight version, chained block hash)
EvictionPolicy = Literal["LRU", "FIFO"]


@dataclass(slots=True)
class TierChanges:
    """Keys added and removed since the last drain; ``cleared``: everything before was dropped.

    Applied in the order cleared, removed, added, they turn the state before into the state now:
    a key both admitted and dropped since the last drain is only in ``removed`` (the reader may
    have held it from an earlier drain), a key dropped and admitted again is in both."""

    added: list[TierKey] = field(default_factory=list)
    removed: list[TierKey] = field(default_factory=list)
    cleared: bool = False

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.cleared)


@dataclass(slots=True)
class _Journal:
    """The changes since the last drain, netted as they happen (dicts: insertion order, O(1) removal)."""

    added: dict[TierKey, None] = field(default_factory=dict)
    removed: dict[TierKey, None] = field(default_factory=dict)
    cleared: bool = False

    def admitted(self, key: TierKey) -> None:
        self.added[key] = None

    def dropped(self, key: TierKey) -> None:
        self.added.pop(key, None)
        self.removed[key] = None

    def changes(self) -> TierChanges:
        return TierChanges(list(self.added), list(self.removed), self.cleared)


class TierIndex:
    """Bookkeeping of a byte-bounded tier; the payloads live in a store keyed the same way."""

    def __init__(self, capacity_bytes: int, policy: EvictionPolicy = "LRU", pin_budget: int = 0) -> None:
        """``pin_budget``: most keys pinned at once (0 = no limit); pins beyond it are not granted."""
        if capacity_bytes <= 0:
            raise ValueError(f"tier capacity must be positive, not {capacity_bytes} bytes")
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.pin_budget = pin_budget
        self.used_bytes = 0
        self.reserved_bytes = 0  # room held for blocks on their way in (written in place), in no entry yet
        self._sizes: OrderedDict[TierKey, int] = OrderedDict()  # oldest (next victim) first
        self._pins: dict[str, set[TierKey]] = {}
        self._pin_counts: dict[TierKey, int] = {}
        self._journal = _Journal()
        self.num_evicted = 0

    def __contains__(self, key: TierKey) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def keys(self) -> list[TierKey]:
        return list(self._sizes)

    def touch(self, key: TierKey) -> None:
        """A hit: under LRU the key becomes the most recent."""
        if self.policy == "LRU" and key in self._sizes:
            self._sizes.move_to_end(key)

    def admit(self, key: TierKey, nbytes: int) -> list[TierKey] | None:
        """Make room for ``key`` and record it; returns the keys evicted for it (the caller drops their
        payloads), or None when it cannot fit (bigger than the tier, or the rest is pinned)."""
        if key in self._sizes:
            self.touch(key)
            return []
        if nbytes > self.capacity_bytes:
            return None
        victims = self._make_room(nbytes)
        if victims is None:
            return None
        self._sizes[key] = nbytes
        self.used_bytes += nbytes
        self._journal.admitted(key)
        return victims

    def reserve(self, nbytes: int) -> list[TierKey] | None:
        """Hold ``nbytes`` of room for blocks that will be admitted later (evicting for it, as
        ``admit`` would); the evicted keys, or None when it cannot be had. ``unreserve`` gives it back."""
        victims = self._make_room(nbytes)
        if victims is None:
            return None
        self.reserved_bytes += nbytes
        return victims

    def _make_room(self, nbytes: int) -> list[TierKey] | None:
        """Evict until ``nbytes`` more fit; the evicted keys, or None when pins leave too little."""
        victims = self._victims(self.used_bytes + self.reserved_bytes + nbytes - self.capacity_bytes)
        if victims is None:
            return None
        for victim in victims:
            self._drop(victim)
        self.num_evicted += len(victims)
        return victims

    def evict_next(self, keep: Container[TierKey] = ()) -> TierKey | None:
        """Drop the next key in eviction order that is neither pinned nor in ``keep`` (the store needs
        more room than the bytes counted here: see psrl.kvcache.lmcache_store); None when none is left."""
        victims = self._victims(1, keep)
        if not victims:
            return None
        self._drop(victims[0])
        self.num_evicted += 1
        return victims[0]

    def unreserve(self, nbytes: int) -> None:
        self.reserved_bytes -= nbytes

    def remove(self, key: TierKey) -> bool:
        if key not in self._sizes or self._pin_counts.get(key):
            return False
        self._drop(key)
        return True

    def clear(self) -> list[TierKey]:
        """Drop every entry (pins too: a cleared tier holds nothing to protect); returns the dropped keys."""
        dropped = list(self._sizes)
        self._sizes.clear()
        self._pins.clear()
        self._pin_counts.clear()
        self.used_bytes = 0
        self._journal = _Journal(cleared=True)
        return dropped

    def pin(self, owner: str, keys: list[TierKey]) -> int:
        """Protect ``keys`` (those present, in order, within the pin budget) from eviction until
        ``unpin(owner)``; returns how many ``owner`` holds."""
        held = self._pins.setdefault(owner, set())
        for key in keys:
            if self.pin_budget and len(self._pin_counts) >= self.pin_budget and key not in self._pin_counts:
                break
            if key in self._sizes and key not in held:
                held.add(key)
                self._pin_counts[key] = self._pin_counts.get(key, 0) + 1
        return len(held)

    def unpin(self, owner: str) -> None:
        self._release(self._pins.pop(owner, set()))

    def unpin_keys(self, owner: str, keys: list[TierKey]) -> None:
        """Release ``owner``'s pins of ``keys`` only (a transfer served part of what it pinned)."""
        held = self._pins.get(owner)
        if held is None:
            return
        released = held.intersection(keys)
        held.difference_update(released)
        if not held:
            del self._pins[owner]
        self._release(released)

    def _release(self, keys: set[TierKey]) -> None:
        for key in keys:
            count = self._pin_counts.pop(key, 1) - 1
            if count > 0:
                self._pin_counts[key] = count

    def is_pinned(self, key: TierKey) -> bool:
        return self._pin_counts.get(key, 0) > 0

    @property
    def pin_owners(self) -> list[str]:
        return list(self._pins)

    def drain_changes(self) -> TierChanges:
        journal, self._journal = self._journal, _Journal()
        return journal.changes()

    def _victims(self, needed: int, keep: Container[TierKey] = ()) -> list[TierKey] | None:
        """Keys to evict, in eviction order, until ``needed`` bytes are freed (never a pinned one nor
        one in ``keep``); None when they cannot free that much."""
        if needed <= 0:
            return []
        victims, freed = [], 0
        for key, size in self._sizes.items():
            if self._pin_counts.get(key) or key in keep:
                continue
            victims.append(key)
            freed += size
            if freed >= needed:
                return victims
        return None

    def _drop(self, key: TierKey) -> None:
        self.used_bytes -= self._sizes.pop(key)
        self._journal.dropped(key)
