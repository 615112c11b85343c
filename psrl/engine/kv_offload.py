"""The engine's side of the offload tier: copies between paged KV blocks and the tier.

Every block is tagged with the weight version the engine ran when it was offloaded. That is the
version that computed it: the prefix cache is reset on every weight load, so a block still
registered (hashed) was filled under the current weights; a sequence that straddles a weight
update never registers its blocks again (psrl.engine.block_manager), so its old-version keys and
values can reach neither the device prefix cache nor the tier.

Copies are batched, not made block by block as the block manager decides them: a block given up
is gathered at the next ``flush`` (its contents stay until the next model step writes it), and a
block loaded is read out of the tier at once into a staging tensor (so nothing the tier does
meanwhile can take it away) and written into its place at the next ``flush``. The engine flushes
before every model step and before anything else touches the KV cache or the tier. A flush first
gathers the blocks given up, then writes the loaded ones (a block may be both: given up, then
reused for a load), then stores the gathered ones in the tier. On a GPU with a pinned tier
(``psrl.kvcache.host_store``) every copy is queued on the stream; nothing waits for the host.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from psrl.engine.block_manager import Block
from psrl.kvcache.host_store import HostStore
from psrl.kvcache.index import TierKey
from psrl.kvcache.tier import KvTier, PayloadStore

# staged or gathered bytes at most between flushes (device memory the KV cache's budget did not count)
MAX_PENDING_BYTES = 64 << 20


class EngineOffload:
    """``OffloadTier`` of the block manager over one engine's KV cache tensor."""

    def __init__(self, tier: KvTier, kv_cache: torch.Tensor, version_of: Callable[[], int]) -> None:
        self.tier = tier
        self.kv_cache = kv_cache  # [layers, blocks + 1, block_size, 2, kv heads, head dim]
        self.version_of = version_of
        self.num_offloaded_blocks = 0
        self.num_loaded_blocks = 0
        block_bytes = kv_cache[:, 0].numel() * kv_cache.element_size()
        self.max_pending_blocks = max(1, MAX_PENDING_BYTES // block_bytes)
        self.tier_blocks = tier.index.capacity_bytes // block_bytes
        self._given_up: list[tuple[TierKey, tuple[int, ...], int]] = []  # key, tokens, block id
        self._loads: list[tuple[list[int], torch.Tensor]] = []  # block ids, their staged rows
        self._loading: set[int] = set()  # block ids with a staged row not yet written

    @property
    def block_shape(self) -> tuple[int, ...]:
        return tuple(self.kv_cache[:, 0].shape)

    def offload(self, block: Block) -> None:
        if block.block_id in self._loading:  # it must hold its loaded contents before they are gathered
            self.flush()
        self._given_up.append(((self.version_of(), block.hash), block.token_ids, block.block_id))
        if len(self._given_up) >= self.max_pending_blocks:
            self.flush()

    def held_prefix(self, block_hashes: list[int], token_ids: list[tuple[int, ...]]) -> int:
        version = self.version_of()
        return self.tier.held_prefix([(version, block_hash) for block_hash in block_hashes], token_ids)

    def load(self, block_ids: list[int], block_hashes: list[int], token_ids: list[tuple[int, ...]]) -> int:
        """Read the tier's copies of these blocks into staging, from the first up to one it lacks (they
        land in ``block_ids`` at the next flush); how many."""
        version, loaded = self.version_of(), 0
        for start in range(0, len(block_ids), self.max_pending_blocks):
            ids = block_ids[start : start + self.max_pending_blocks]
            staged = sum(len(pending) for pending, _ in self._loads)
            if self._loading.intersection(ids) or staged + len(ids) > self.max_pending_blocks:
                self.flush()
            keys = [(version, block_hash) for block_hash in block_hashes[start : start + len(ids)]]
            rows = self.kv_cache.new_empty((len(ids), *self.block_shape))
            held = self.tier.read_many_into(keys, rows)
            count = _leading_matches(held, token_ids[start : start + len(ids)])
            if count:
                self._loads.append((ids[:count], rows[:count]))
                self._loading.update(ids[:count])
            loaded += count
            if count < len(ids):
                break
        self.num_loaded_blocks += loaded
        return loaded

    def flush(self) -> None:
        """Run the copies decided since the last flush (see the module's note for their order)."""
        if not self._given_up and not self._loads:  # most steps
            return
        # as if stored one by one: when more were given up than the tier holds, the last ones stay
        given_up, self._given_up = self._given_up[-self.tier_blocks :] if self.tier_blocks else [], []
        loads, self._loads = self._loads, []
        self._loading.clear()
        gathered = self._gather([block_id for _, _, block_id in given_up]) if given_up else None
        for block_ids, rows in loads:
            self.kv_cache.index_copy_(1, self._index(block_ids), rows.transpose(0, 1))
        if gathered is not None:
            keys = [key for key, _, _ in given_up]
            self.num_offloaded_blocks += self.tier.put_many(keys, [tokens for _, tokens, _ in given_up], gathered)

    def offload_blocks(self, blocks: list[Block]) -> list[TierKey]:
        """Copy these registered blocks to the tier now, together (a peer is about to ask for them: the
        tier keeps them as one run, psrl.kvcache.lmcache_store); the keys of the prefix it took."""
        self.flush()
        if not blocks:
            return []
        version = self.version_of()
        keys = [(version, block.hash) for block in blocks]
        rows = self._gather([block.block_id for block in blocks])
        held = self.tier.put_many(keys, [block.token_ids for block in blocks], rows)
        return keys[:held]

    def _gather(self, block_ids: list[int]) -> torch.Tensor:
        """The blocks' contents as of now, a block per row (on the cache's device)."""
        return self.kv_cache.index_select(1, self._index(block_ids)).transpose(0, 1).contiguous()

    def _index(self, block_ids: list[int]) -> torch.Tensor:
        return torch.tensor(block_ids, dtype=torch.long).to(self.kv_cache.device, non_blocking=True)


def _leading_matches(held: list[tuple[int, ...]], wanted: list[tuple[int, ...]]) -> int:
    """How many leading entries the tier held for exactly the tokens asked for."""
    count = 0
    for got, want in zip(held, wanted, strict=False):
        if got != want:
            break
        count += 1
    return count


def make_tier(
    capacity_bytes: int,
    block_shape: tuple[int, ...],
    dtype: torch.dtype,
    policy: str,
    pin_budget: int = 0,
    store: str = "lmcache",
    *,
    pin: bool = False,
) -> KvTier:
    """A tier whose bytes live in LMCache's CPU backend (raises MissingExtraError without the kv extra),
    or with ``store="host"`` in psrl's own host buffer (psrl.kvcache.host_store; ``pin``: page-locked
    for an engine on a GPU)."""
    payload: PayloadStore
    if store == "host":
        payload = HostStore(capacity_bytes, block_shape, dtype, pin=pin)
    elif store == "lmcache":
        from psrl.kvcache.lmcache_store import LmcacheStore

        payload = LmcacheStore(capacity_bytes, block_shape, dtype)
    else:
        raise ValueError(f"offload store {store!r} is unknown: use lmcache or host (psrl.lmcache.store)")
    return KvTier(payload, capacity_bytes, "FIFO" if policy == "FIFO" else "LRU", pin_budget)
