"""Paged KV-cache allocator with a prefix cache.

A block holds `block_size` consecutive token positions. Full blocks whose keys/values have been
computed are registered under a chained hash (the previous block's hash folded into this block's
token ids), so a block stands for its whole prefix; a lookup hit is confirmed by comparing token
ids, so a hash collision cannot corrupt a sequence. Freed blocks keep contents and hash until they
are reused, least recently freed first, so a finished or preempted sequence's prefix can still be
hit. `reset_prefix_cache` starts a new epoch: blocks computed before it (e.g. with older weights)
are never shared again, not even when their sequence fills them later.

With an offload tier (psrl.engine.kv_offload), a cached block about to be reused is first copied
to the tier, and a prefix lookup that runs out of device hits continues in the tier: each block
found there is loaded into a fresh block and registered like a computed one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from psrl.engine.sequence import Sequence
from psrl.kvcache.keys import NO_HASH, chained_hash, reusable_blocks


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int = NO_HASH
    token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class PrefixCacheStats:
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


TIER_LOOKUP_PIECE = 16  # blocks hashed and looked up in the tier at a time


class OffloadTier(Protocol):
    """Where cached blocks go when the device needs their room, and come back from."""

    def offload(self, block: Block) -> None:
        """``block`` (hashed, free) is about to be overwritten: keep a copy of its keys/values."""
        ...

    def held_prefix(self, block_hashes: list[int], token_ids: list[tuple[int, ...]]) -> int:
        """How many of these blocks, from the first, the tier holds (nothing copied)."""
        ...

    def load(self, block_ids: list[int], block_hashes: list[int], token_ids: list[tuple[int, ...]]) -> int:
        """Fill ``block_ids`` with the tier's copies of these blocks, from the first up to one it lacks
        (before the next model step); how many."""
        ...


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        tier: OffloadTier | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.tier = tier if enable_prefix_caching else None
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        # ordered set: O(1) removal of a hit block, oldest-freed first on allocation (an OrderedDict, because
        # taking the first key of a plain dict walks over the slots of every key deleted before it)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._hash_to_block_id: dict[int, int] = {}
        self.cache_epoch = 0
        self.stats = PrefixCacheStats()
        self.num_tier_loaded_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def num_blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    # admission: blocks for a sequence's whole current context

    def can_allocate(self, seq: Sequence) -> bool:
        # conservative: prefix hits may need fewer free blocks, never more
        return self.num_blocks_for(seq.num_tokens) <= len(self._free)

    def allocate(self, seq: Sequence) -> None:
        """Give `seq` blocks for all its tokens, reusing cached full blocks of its prefix."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.request_id} already holds blocks")
        hit_block_ids = self._lookup_prefix(seq) if self.enable_prefix_caching else []
        for block_id in hit_block_ids:
            self._take(block_id)
        if self.tier is not None:
            hit_block_ids += self._load_from_tier(seq, hit_block_ids)
        num_hits = len(hit_block_ids)
        seq.block_table = hit_block_ids
        for _ in range(self.num_blocks_for(seq.num_tokens) - num_hits):
            seq.block_table.append(self._take_fresh())
        seq.cache_epoch = self.cache_epoch
        seq.num_hashed_blocks = num_hits
        seq.num_cached_tokens = num_hits * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        self.stats.num_queried_tokens += seq.num_tokens
        self.stats.num_hit_tokens += seq.num_cached_tokens

    def deallocate(self, seq: Sequence) -> None:
        """Release every block of `seq`; contents and hashes stay for later prefix hits."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0

    # growth: one more token per decode step

    def can_append(self, seq: Sequence) -> bool:
        return self.num_missing_blocks(seq) <= len(self._free)

    def may_append(self, seq: Sequence, num_missing: int | None = None) -> None:
        """Make the block table cover every token of `seq` (after can_append said it can).

        `num_missing`: num_missing_blocks(seq), when the caller has just computed it.
        """
        for _ in range(self.num_missing_blocks(seq) if num_missing is None else num_missing):
            seq.block_table.append(self._take_fresh())

    def num_missing_blocks(self, seq: Sequence) -> int:
        """Blocks `seq` still needs to cover all its tokens."""
        return max(0, self.num_blocks_for(seq.num_tokens) - len(seq.block_table))

    def hash_blocks(self, seq: Sequence) -> None:
        """Register the full blocks of `seq` whose keys/values are now computed."""
        if not self.enable_prefix_caching or seq.cache_epoch != self.cache_epoch:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if num_full <= seq.num_hashed_blocks:  # most steps: no block filled up
            return
        index = seq.num_hashed_blocks
        parent = self.blocks[seq.block_table[index - 1]].hash if index > 0 else NO_HASH
        for index in range(seq.num_hashed_blocks, num_full):
            block = self.blocks[seq.block_table[index]]
            tokens = tuple(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])
            block.hash = chained_hash(parent, tokens)
            block.token_ids = tokens
            self._hash_to_block_id.setdefault(block.hash, block.block_id)
            parent = block.hash
        seq.num_hashed_blocks = max(num_full, seq.num_hashed_blocks)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix; blocks in use stay with their sequences but are never shared."""
        for block in self.blocks:
            block.hash = NO_HASH
            block.token_ids = ()
        self._hash_to_block_id.clear()
        self.cache_epoch += 1

    def cached_blocks(self, token_ids: list[int]) -> list[Block]:
        """The registered blocks that hold the longest cached prefix of ``token_ids`` (whole blocks)."""
        return [self.blocks[i] for i in self._lookup_tokens(token_ids, len(token_ids) // self.block_size)]

    def _lookup_prefix(self, seq: Sequence) -> list[int]:
        return self._lookup_tokens(seq.token_ids, reusable_blocks(seq.num_tokens, self.block_size))

    def _lookup_tokens(self, token_ids: list[int], max_blocks: int) -> list[int]:
        hits: list[int] = []
        parent = NO_HASH
        for index in range(max_blocks):
            tokens = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            parent = chained_hash(parent, tokens)
            block_id = self._hash_to_block_id.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    def _load_from_tier(self, seq: Sequence, device_hits: list[int]) -> list[int]:
        """Continue the prefix past the device hits with blocks the tier holds (loaded into fresh blocks)."""
        tier = self.tier
        assert tier is not None
        parent = self.blocks[device_hits[-1]].hash if device_hits else NO_HASH
        hashes, tokens = self._held_chain(seq, len(device_hits), parent)
        block_ids = [self._take_fresh() for _ in hashes]
        count = tier.load(block_ids, hashes, tokens) if hashes else 0
        for block_id in reversed(block_ids[count:]):  # lost meanwhile (a peer's transfer made room)
            self._release_unfilled(block_id)
        for block_id, block_hash, block_tokens in zip(block_ids[:count], hashes, tokens, strict=False):
            block = self.blocks[block_id]
            block.hash, block.token_ids = block_hash, block_tokens
            self._hash_to_block_id.setdefault(block_hash, block_id)
        self.num_tier_loaded_blocks += count
        return block_ids[:count]

    def extend_from_tier(self, seq: Sequence) -> int:
        """Load tier blocks that landed after ``seq`` was allocated (an async KV transfer) over its
        not-yet-computed whole blocks, in prefix order; returns how many tokens it no longer computes."""
        size = self.block_size
        start = seq.num_computed_tokens // size
        if self.tier is None or seq.cache_epoch != self.cache_epoch or seq.num_computed_tokens % size:
            return 0
        if start != seq.num_hashed_blocks:  # the chain of hashes must reach the first block to fill
            return 0
        parent = self.blocks[seq.block_table[start - 1]].hash if start > 0 else NO_HASH
        hashes, tokens = self._held_chain(seq, start, parent)
        loaded = self.tier.load(seq.block_table[start : start + len(hashes)], hashes, tokens) if hashes else 0
        if loaded:
            seq.num_computed_tokens += loaded * size
            seq.num_cached_tokens += loaded * size
            self.stats.num_hit_tokens += loaded * size
            self.num_tier_loaded_blocks += loaded
            self.hash_blocks(seq)
        return loaded * size

    def _held_chain(self, seq: Sequence, first: int, parent: int) -> tuple[list[int], list[tuple[int, ...]]]:
        """Chained hashes and token ids of ``seq``'s reusable whole blocks from ``first`` on, as far as
        the tier holds them (hashed a piece at a time: most lookups stop at their first block)."""
        assert self.tier is not None
        size, end = self.block_size, reusable_blocks(seq.num_tokens, self.block_size)
        hashes: list[int] = []
        tokens: list[tuple[int, ...]] = []
        for piece_start in range(first, end, TIER_LOOKUP_PIECE):
            piece_hashes, piece_tokens = [], []
            for index in range(piece_start, min(piece_start + TIER_LOOKUP_PIECE, end)):
                block_tokens = tuple(seq.token_ids[index * size : (index + 1) * size])
                parent = chained_hash(parent, block_tokens)
                piece_hashes.append(parent)
                piece_tokens.append(block_tokens)
            held = self.tier.held_prefix(piece_hashes, piece_tokens)
            hashes += piece_hashes[:held]
            tokens += piece_tokens[:held]
            if held < len(piece_hashes):
                break
        return hashes, tokens

    def _release_unfilled(self, block_id: int) -> None:
        # back at the head of the free order: it holds nothing worth keeping
        self.blocks[block_id].ref_count = 0
        self._free[block_id] = None
        self._free.move_to_end(block_id, last=False)

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _take_fresh(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash != NO_HASH and self._hash_to_block_id.get(block.hash) == block_id:
            if self.tier is not None:
                self.tier.offload(block)
            del self._hash_to_block_id[block.hash]
        block.hash = NO_HASH
        block.token_ids = ()
        block.ref_count = 1
        return block_id
