"""The engine's side of the offload tier: copies between paged KV blocks and the tier.

Every block is tagged with the weight version the engine ran when it was offloaded. That is the
version that computed it: the prefix cache is reset on every weight load, so a block still
registered (hashed) was filled under the current weights; a sequence that straddles a weight
update never registers its blocks again (psrl.engine.block_manager), so its old-version keys and
values can reach neither the device prefix cache nor the tier.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from psrl.engine.block_manager import Block
from psrl.kvcache.host_store import HostStore
from psrl.kvcache.index import TierKey
from psrl.kvcache.tier import KvTier, PayloadStore


class EngineOffload:
    """``OffloadTier`` of the block manager over one engine's KV cache tensor."""

    def __init__(self, tier: KvTier, kv_cache: torch.Tensor, version_of: Callable[[], int]) -> None:
        self.tier = tier
        self.kv_cache = kv_cache  # [layers, blocks + 1, block_size, 2, kv heads, head dim]
        self.version_of = version_of
        self.num_offloaded_blocks = 0
        self.num_loaded_blocks = 0

    @property
    def block_shape(self) -> tuple[int, ...]:
        return tuple(self.kv_cache[:, 0].shape)

    def offload(self, block: Block) -> None:
        if self.tier.put((self.version_of(), block.hash), block.token_ids, self.kv_cache[:, block.block_id]):
            self.num_offloaded_blocks += 1

    def load(self, block_id: int, block_hash: int, token_ids: tuple[int, ...]) -> bool:
        if self.tier.get_into((self.version_of(), block_hash), token_ids, self.kv_cache[:, block_id]):
            self.num_loaded_blocks += 1
            return True
        return False

    def offload_blocks(self, blocks: list[Block]) -> list[TierKey]:
        """Copy these registered blocks to the tier now, together (a peer is about to ask for them: the
        tier keeps them as one run, psrl.kvcache.lmcache_store); the keys of the prefix it took."""
        if not blocks:
            return []
        version = self.version_of()
        keys = [(version, block.hash) for block in blocks]
        rows = self.kv_cache[:, [block.block_id for block in blocks]].transpose(0, 1)
        held = self.tier.put_many(keys, [block.token_ids for block in blocks], rows)
        return keys[:held]


def make_tier(
    capacity_bytes: int,
    block_shape: tuple[int, ...],
    dtype: torch.dtype,
    policy: str,
    pin_budget: int = 0,
    store: str = "lmcache",
) -> KvTier:
    """A tier whose bytes live in LMCache's CPU backend (raises MissingExtraError without the kv extra),
    or with ``store="host"`` in psrl's own host buffer (psrl.kvcache.host_store)."""
    payload: PayloadStore
    if store == "host":
        payload = HostStore(capacity_bytes, block_shape, dtype)
    elif store == "lmcache":
        from psrl.kvcache.lmcache_store import LmcacheStore

        payload = LmcacheStore(capacity_bytes, block_shape, dtype)
    else:
        raise ValueError(f"offload store {store!r} is unknown: use lmcache or host (psrl.lmcache.store)")
    return KvTier(payload, capacity_bytes, "FIFO" if policy == "FIFO" else "LRU", pin_budget)
