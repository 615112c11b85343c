"""The offload tier: version-tagged KV blocks in CPU memory, bounded in bytes, evicted LRU (or FIFO).

``TierIndex`` decides what stays; a ``PayloadStore`` holds the bytes (LMCache's CPU backend,
psrl.kvcache.lmcache_store). Every entry keeps its block's token ids, so a hit is confirmed
against the tokens and a hash collision cannot hand a sequence someone else's keys/values.

Thread-safe: the rollout loop stores and loads while the KV transfer server (another thread)
reads entries for a peer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

import torch

from psrl.kvcache.index import EvictionPolicy, TierChanges, TierIndex, TierKey


class PayloadStore(Protocol):
    def put(self, key: TierKey, kv: torch.Tensor) -> None:
        """Keep a copy of ``kv`` under ``key`` (replacing nothing: the index admits each key once)."""
        ...

    def get(self, key: TierKey) -> torch.Tensor | None:
        """The stored tensor (valid until ``delete(key)``), or None."""
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
        with self._lock:
            if key in self.index:
                self.index.touch(key)
                return True
            evicted = self.index.admit(key, kv.numel() * kv.element_size())
            if evicted is None:
                self.stats.num_refused += 1
                return False
            for victim in evicted:
                self._forget(victim)
            self.store.put(key, kv)
            self._tokens[key] = token_ids
            self.stats.num_stored += 1
            return True

    def get_into(self, key: TierKey, token_ids: tuple[int, ...], out: torch.Tensor) -> bool:
        """Copy the entry into ``out`` (same shape) when the tier holds it for exactly these tokens."""
        with self._lock:
            payload = self._payload(key, token_ids)
            if payload is None:
                return False
            out.copy_(payload.view(out.shape))
            return True

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

    def _forget(self, key: TierKey) -> None:
        self._tokens.pop(key, None)
        self.store.delete(key)
