"""The offload tier: version-tagged KV blocks in CPU memory, bounded in bytes, evicted LRU (or FIFO).

``TierIndex`` decides what stays; a ``PayloadStore`` holds the bytes (LMCache's CPU backend,
psrl.kvcache.lmcache_store). Every entry keeps its block's token ids, so a hit is confirmed
against the tokens and a hash collision cannot hand a sequence someone else's keys/values.

Thread-safe: the rollout loop stores and loads while the KV transfer server (another thread)
reads entries for a peer.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from psrl.kvcache.index import EvictionPolicy, TierChanges, TierIndex, TierKey

Stored = TypeVar("Stored")


class PayloadStore(Protocol):
    def put_many(self, keys: list[TierKey], kvs: torch.Tensor) -> None:
        """Keep a copy of each row of ``kvs`` (a block each, any strides) under its key (replacing
        nothing: the index admits each key once); MemoryError when the store has no room for them."""
        ...

    def read_many_into(self, keys: list[TierKey], out: torch.Tensor) -> int:
        """Copy the entries of ``keys`` into the rows of ``out`` up to the first one missing; how many."""
        ...

    def get(self, key: TierKey) -> torch.Tensor | None:
        """The stored tensor (valid until ``delete(key)``), or None."""
        ...

    def contains(self, key: TierKey) -> bool:
        """Whether ``get(key)`` would find it (no copy, nothing waited for)."""
        ...

    def delete(self, key: TierKey) -> None: ...

    def clear(self) -> None: ...


@dataclass(slots=True)
class TierStats:
    num_stored: int = 0
    num_hits: int = 0
    num_misses: int = 0
    num_refused: int = 0  # no room (the rest pinned) or bigger than the tier

    def as_dict(self) -> dict[str, int]:
        return {
            "stored": self.num_stored,
            "hits": self.num_hits,
            "misses": self.num_misses,
            "refused": self.num_refused,
        }


class KvTier:
    def __init__(
        self, store: PayloadStore, capacity_bytes: int, policy: EvictionPolicy = "LRU", pin_budget: int = 0
    ) -> None:
        self.store = store
        self.index = TierIndex(capacity_bytes, policy, pin_budget)
        self.stats = TierStats()
        self._tokens: dict[TierKey, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: TierKey) -> bool:
        with self._lock:
            return key in self.index

    @property
    def used_bytes(self) -> int:
        return self.index.used_bytes

    def put(self, key: TierKey, token_ids: tuple[int, ...], kv: torch.Tensor) -> bool:
        """Store one block's keys/values under ``(version, hash)``; False when the tier refused it."""
        return self.put_many([key], [token_ids], kv.unsqueeze(0)) == 1

    def put_many(self, keys: list[TierKey], token_ids: list[tuple[int, ...]], kvs: torch.Tensor) -> int:
        """Store a run of blocks (``kvs``: one per row) under one lock, as a peer's piece lands or an
        engine exports a prefix; stops at the first refused block (only a gapless prefix is of use)
        and returns how many of ``keys`` the tier holds now."""
        block_bytes = kvs[0].numel() * kvs.element_size() if len(kvs) else 0
        with self._lock:
            admitted, held = self._admit_prefix(keys, token_ids, lambda index: block_bytes)
            try:
                for start, count in index_runs(admitted):
                    rows = slice(start, start + count)  # none of ``keys`` is evicted to make room for the rest
                    self._with_room(functools.partial(self.store.put_many, keys[rows], kvs[rows]), keys)
            except Exception as exc:
                for index in admitted:  # the index must not claim what the store does not hold
                    self.index.remove(keys[index])
                    self._tokens.pop(keys[index], None)
                    self.store.delete(keys[index])
                if not isinstance(exc, MemoryError):
                    raise
                self.stats.num_refused += 1  # the rest is pinned or lent out
                return admitted[0]
            self.stats.num_stored += len(admitted)
            return held

    def reserve(self, count: int) -> Any:
        """Room for ``count`` blocks that a peer writes in place (NIXL): held in the index (evicting
        for it, so that the store's allocations never exceed the capacity) and allocated in the
        store, until ``land_reserved`` or ``release_reserved``. Needs a store that reserves (LmcacheStore)."""
        reserve = getattr(self.store, "reserve", None)
        if reserve is None:
            raise TypeError(f"{type(self.store).__name__} cannot reserve room for blocks written in place")
        with self._lock:
            layout = self.peek_layout_locked()
            nbytes = count * layout.numel() * layout.element_size()
            evicted = self.index.reserve(nbytes)
            if evicted is None:
                raise MemoryError(f"no room in the tier for {count} blocks (the rest is pinned or reserved)")
            for victim in evicted:
                self._forget(victim)
            try:
                reservation = self._with_room(lambda: reserve(count))
            except Exception:
                self.index.unreserve(nbytes)
                raise
            reservation.nbytes = nbytes
            return reservation

    def land_reserved(self, keys: list[TierKey], token_ids: list[tuple[int, ...]], reservation: Any) -> int:
        """``put_many`` for blocks already written into ``reservation`` (its first ``len(keys)``
        blocks, in order); the room not kept goes back. How many of ``keys`` the tier holds."""
        with self._lock:
            if not reservation.open:
                raise ValueError("this reservation has landed or been released already")
            if len(keys) > len(reservation.regions):
                raise ValueError(f"{len(keys)} blocks to land in room reserved for {len(reservation.regions)}")
            reservation.open = False
            self.index.unreserve(reservation.nbytes)  # the blocks admitted now take its place
            kept, held = self._admit_prefix(keys, token_ids, lambda index: reservation.regions[index][1])
            adopted = set(kept)
            self.store.adopt(reservation, [key if i in adopted else None for i, key in enumerate(keys)])  # type: ignore[attr-defined]
            self.stats.num_stored += len(kept)
        return held

    def release_reserved(self, reservation: Any) -> None:
        """Give back a reservation's room unused (its writes are done or will never come)."""
        with self._lock:
            if reservation.open:
                reservation.open = False
                self.index.unreserve(reservation.nbytes)
                reservation.release()

    def get_into(self, key: TierKey, token_ids: tuple[int, ...], out: torch.Tensor) -> bool:
        """Copy the entry into ``out`` (same shape) when the tier holds it for exactly these tokens."""
        with self._lock:
            payload = self._payload(key, token_ids)
            if payload is None:
                return False
            out.copy_(payload.view(out.shape))
            return True

    def held_prefix(self, keys: list[TierKey], token_ids: list[tuple[int, ...]]) -> int:
        """How many of ``keys``, from the first, the tier holds for exactly these tokens (no copy, no
        hit counted: a reader asks before it takes room for them)."""
        with self._lock:
            count = 0
            for key, tokens in zip(keys, token_ids, strict=True):
                if self._tokens.get(key) != tokens or not self.store.contains(key):
                    break
                count += 1
            return count

    def read(self, key: TierKey) -> tuple[tuple[int, ...], torch.Tensor] | None:
        """(token ids, a copy of the payload) for a peer, or None."""
        with self._lock:
            tokens = self._tokens.get(key)
            payload = None if tokens is None else self._payload(key, tokens)
            return None if payload is None or tokens is None else (tokens, payload.clone())

    def read_into(self, key: TierKey, out: torch.Tensor) -> tuple[int, ...] | None:
        """Copy the entry into ``out`` (a peer's staging area) and return its token ids, or None."""
        with self._lock:
            tokens = self._tokens.get(key)
            payload = None if tokens is None else self._payload(key, tokens)
            if payload is None or tokens is None:
                return None
            out.copy_(payload.view(out.shape))
            return tokens

    def read_many_into(self, keys: list[TierKey], out: torch.Tensor) -> list[tuple[int, ...]]:
        """Copy the entries of ``keys`` into the rows of ``out`` (one block each) under one lock, up
        to the first one the tier lacks; their token ids (a gapless prefix of ``keys``)."""
        with self._lock:
            known = list(itertools.takewhile(lambda key: key in self._tokens, keys[: len(out)]))
            count = self.store.read_many_into(known, out) if known else 0
            for key in known[:count]:
                self.index.touch(key)
            self.stats.num_hits += count
            if count < len(known):  # the store lost it: forget the entry rather than serve a gap
                self.index.remove(known[count])
                self._tokens.pop(known[count], None)
                self.stats.num_misses += 1
            return [self._tokens[key] for key in known[:count]]

    def lend_many(self, keys: list[TierKey]) -> tuple[list[tuple[int, ...]], list[torch.Tensor], Callable[[], None]]:
        """``read_many_into`` without the copy, for a sender: (token ids of the gapless prefix held,
        views of their bytes in order, release). The views stay valid, even past an eviction,
        until ``release`` is called; needs a store that lends (``lend_many``)."""
        lend = getattr(self.store, "lend_many", None)
        if lend is None:
            raise TypeError(f"{type(self.store).__name__} does not lend its bytes; use read_many_into")
        with self._lock:
            known = list(itertools.takewhile(lambda key: key in self._tokens, keys))
            count, views, release = lend(known)
            for key in known[:count]:
                self.index.touch(key)
            self.stats.num_hits += count
            return [self._tokens[key] for key in known[:count]], views, release

    def peek_layout(self) -> torch.Tensor | None:
        """A storage-less tensor with one block's shape and dtype (None while unknown)."""
        shape, dtype = getattr(self.store, "block_shape", None), getattr(self.store, "dtype", None)
        if shape is not None and dtype is not None:
            return torch.empty(shape, dtype=dtype, device="meta")
        with self._lock:
            for key in self._tokens:
                payload = self.store.get(key)
                if payload is not None:
                    return torch.empty(payload.shape, dtype=payload.dtype, device="meta")
        return None

    def peek_layout_locked(self) -> torch.Tensor:
        """One block's layout from a store with a fixed one (no lock taken: the caller may hold it)."""
        shape, dtype = getattr(self.store, "block_shape", None), getattr(self.store, "dtype", None)
        if shape is None or dtype is None:
            raise TypeError(f"{type(self.store).__name__} has no fixed block shape")
        return torch.empty(shape, dtype=dtype, device="meta")

    def pin(self, owner: str, keys: list[TierKey]) -> int:
        with self._lock:
            return self.index.pin(owner, keys)

    def unpin(self, owner: str) -> None:
        with self._lock:
            self.index.unpin(owner)

    def unpin_keys(self, owner: str, keys: list[TierKey]) -> None:
        with self._lock:
            self.index.unpin_keys(owner, keys)

    def clear(self) -> None:
        with self._lock:
            self.index.clear()
            self._tokens.clear()
            self.store.clear()

    def drain_changes(self) -> TierChanges:
        with self._lock:
            return self.index.drain_changes()

    def snapshot(self) -> TierChanges:
        """Every key held, as changes that replace whatever a reader knew (the journal restarts)."""
        with self._lock:
            self.index.drain_changes()
            return TierChanges(added=self.index.keys(), cleared=True)

    def keys(self) -> list[TierKey]:
        with self._lock:
            return self.index.keys()

    def _payload(self, key: TierKey, token_ids: tuple[int, ...]) -> torch.Tensor | None:
        if self._tokens.get(key) != token_ids:
            self.stats.num_misses += 1
            return None
        payload = self.store.get(key)
        if payload is None:  # the store lost it: forget the entry rather than report a hit
            self.index.remove(key)
            self._tokens.pop(key, None)
            self.stats.num_misses += 1
            return None
        self.index.touch(key)
        self.stats.num_hits += 1
        return payload

    def _admit_prefix(
        self, keys: list[TierKey], token_ids: list[tuple[int, ...]], size_of: Callable[[int], int]
    ) -> tuple[list[int], int]:
        """Admit ``keys`` in order up to the first the index refuses (under the lock): the positions
        newly admitted (their payloads still to be stored) and how many of ``keys`` the tier holds."""
        admitted: list[int] = []
        held = 0
        for index, (key, tokens) in enumerate(zip(keys, token_ids, strict=True)):
            if key in self.index:
                self.index.touch(key)
            else:
                evicted = self.index.admit(key, size_of(index))
                if evicted is None:
                    self.stats.num_refused += 1
                    break
                for victim in evicted:
                    self._forget(victim)
                admitted.append(index)
                self._tokens[key] = tokens
            held += 1
        return admitted, held

    def _with_room(self, allocate: Callable[[], Stored], keep: Container[TierKey] = ()) -> Stored:
        """``allocate`` (a store call that takes room), evicting further in the index's order while the
        store finds none (a run's deleted blocks keep their room until its last block goes, and lent
        blocks until their lender lets go): never ``keep`` nor a pinned key. MemoryError when nothing
        is left to evict."""
        while True:
            try:
                return allocate()
            except MemoryError:
                victim = self.index.evict_next(keep)
                if victim is None:
                    raise
                self._forget(victim)

    def _forget(self, key: TierKey) -> None:
        self._tokens.pop(key, None)
        self.store.delete(key)


def index_runs(indices: list[int]) -> list[tuple[int, int]]:
    """(first, length) of each run of consecutive integers in ``indices`` (ascending)."""
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and index == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    return runs
