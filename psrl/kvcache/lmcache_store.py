"""The tier's bytes in LMCache's CPU backend (``LocalCPUBackend`` over one preallocated buffer).

Blocks are stored in runs: one LMCache object holds the blocks that arrived together (a piece a
peer sent, the prefix an engine exported for a re-route) back to back, one block for a block
offloaded on its own. LMCache's work is per object (an allocation, a key hashed, a reference
counted: ~15 us), about what copying a 0.5B model's block costs, so a piece of 64 blocks costs
one object's work instead of 64. A run is freed when its last block is deleted; until then its
deleted blocks' room stays taken, and when LMCache cannot find room the store raises MemoryError
so that the tier evicts further (psrl.kvcache.tier).

Each run's LMCache ``CacheEngineKey`` carries the tag ``lmcache.tag.weight_version``, the version
that computed its blocks: LMCache itself keys versions apart, so even a lookup that bypassed psrl's
index could not cross them. A run of one block is keyed by the block's chained hash, a longer run
by its first block's hash and a run number. psrl's ``TierIndex`` decides eviction (it knows about
pins); LMCache's allocator is asked never to evict on its own.

Needs the optional ``lmcache`` package (extra ``kv``).
"""

from __future__ import annotations

import itertools
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from psrl.errors import MissingExtraError
from psrl.kvcache.host_buffer import huge_page_buffer
from psrl.kvcache.index import TierKey

MODEL_TAG = "psrl"
VERSION_TAG = "lmcache.tag.weight_version"
RUN_TAG = "lmcache.tag.psrl_run"
ALIGN_BYTES = 4096  # LMCache's allocator rounds every allocation up to this
# room for blocks lent to a KV server's sends that the index has evicted meanwhile: three of a
# fetch's largest pieces (psrl.kvcache.transfer.client.MAX_PIECE_BLOCKS), the one on the wire and
# the two asked ahead; pages of it become resident only once a block is stored there
LEND_HEADROOM_BLOCKS = 384


def _import_lmcache() -> dict[str, Any]:
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
    try:
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    except ImportError:
        raise MissingExtraError("psrl.lmcache.enable", "kv", "lmcache") from None
    logging.getLogger("lmcache").setLevel(logging.WARNING)
    return {
        "key": CacheEngineKey,
        "config": LMCacheEngineConfig,
        "allocator": TensorMemoryAllocator,
        "format": MemoryFormat,
        "backend": LocalCPUBackend,
    }


@dataclass(eq=False, slots=True)
class StoredRun:
    """Blocks back to back in one LMCache object stored under one key; freed with its last live block."""

    lm_key: Any
    offset: int  # of its first block in the buffer, in bytes
    live: int  # its blocks not deleted yet


class LmcacheStore:
    """PayloadStore over LMCache's LocalCPUBackend; every block has the same shape and dtype."""

    def __init__(self, capacity_bytes: int, block_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        lm = _import_lmcache()
        self._key_type = lm["key"]
        self._format = lm["format"].KV_2LTD
        self.block_shape = torch.Size(block_shape)
        self.dtype = dtype
        # room for as many blocks as the index admits, even each in a run of its own (rounded up to
        # the allocator's alignment), and for the blocks lent out
        block_bytes = self.block_shape.numel() * dtype.itemsize
        aligned = -(-block_bytes // ALIGN_BYTES) * ALIGN_BYTES
        self.lend_headroom_blocks = LEND_HEADROOM_BLOCKS
        buffer = huge_page_buffer((capacity_bytes // block_bytes + 1 + LEND_HEADROOM_BLOCKS) * aligned)
        self._buffer, self._block_bytes = buffer, block_bytes
        config = lm["config"].from_defaults(
            chunk_size=int(block_shape[1]), local_cpu=True, max_local_cpu_size=buffer.numel() / 1024**3
        )
        self.backend = lm["backend"](config, memory_allocator=lm["allocator"](buffer))
        self._rows: dict[TierKey, tuple[StoredRun, int]] = {}  # a block's run and its place in it
        self._run_numbers = itertools.count(1)
        # hand LMCache its references back before the buffer goes, or it warns about each one
        weakref.finalize(self, self.backend.clear)

    @property
    def memory(self) -> torch.Tensor:
        """The one buffer every block lives in (a peer's NIXL agent writes into it, or reads from it)."""
        return self._buffer

    @property
    def num_runs(self) -> int:
        """LMCache objects holding blocks now."""
        return len({run for run, _ in self._rows.values()})

    # storing

    def put(self, key: TierKey, kv: torch.Tensor) -> None:
        """One block, in a run of its own."""
        self.put_many([key], kv.unsqueeze(0))

    def put_many(self, keys: list[TierKey], kvs: torch.Tensor) -> None:
        """``kvs`` [len(keys), *block_shape], any strides: one run when LMCache finds the room in one piece."""
        parts = self._allocate(len(keys))
        try:
            self._copy_rows(self._offsets(parts), kvs, into_store=True)
        except BaseException:
            Reservation.free(parts)
            raise
        self._store(parts, list(keys))

    def reserve(self, count: int) -> Reservation:
        """Room for ``count`` blocks that a peer writes in place; ``adopt`` it or ``release`` it."""
        parts = self._allocate(count)
        return Reservation(parts, self._offsets(parts), int(self._buffer.data_ptr()), self._block_bytes)

    def reserved_view(self, reservation: Reservation, count: int) -> torch.Tensor | None:
        """The first ``count`` blocks of ``reservation`` as one view of the buffer (bytes) when they lie
        back to back, so a peer's bytes can be received straight into them; else None."""
        offsets = reservation.offsets[:count]
        if not offsets or address_runs(offsets, self._block_bytes) != [(0, count)]:
            return None
        return self._buffer[offsets[0] : offsets[0] + count * self._block_bytes]

    def write_reserved(self, reservation: Reservation, first: int, rows: torch.Tensor) -> None:
        """Copy ``rows`` (one block each) into the blocks of ``reservation`` from ``first`` on."""
        offsets = reservation.offsets[first : first + len(rows)]
        if len(offsets) < len(rows):
            raise ValueError(f"{len(rows)} blocks from block {first} on, {reservation.count} reserved")
        self._copy_rows(offsets, rows, into_store=True)

    def adopt(self, reservation: Reservation, keys: list[TierKey | None]) -> None:
        """Store the blocks of ``reservation`` (written meanwhile) under ``keys``, one per reserved block
        in order (None, or past the end: a block not kept, whose room is given back with its run)."""
        self._store(reservation.parts, keys + [None] * (reservation.count - len(keys)))

    def _allocate(self, count: int) -> list[tuple[Any, int]]:
        """LMCache allocations (object, blocks it holds) for ``count`` blocks in order: one when there is
        contiguous room, else halves, down to a block each (never evicting: the tier does).
        MemoryError when a single block finds no room."""
        parts: list[tuple[Any, int]] = []
        try:
            self._allocate_into(count, parts)
        except MemoryError:
            Reservation.free(parts)
            raise
        return parts

    def _allocate_into(self, count: int, parts: list[tuple[Any, int]]) -> None:
        shape = torch.Size([count, *self.block_shape])
        obj = self.backend.allocate(shape, self.dtype, self._format, eviction=False)
        if obj is not None:
            parts.append((obj, count))
        elif count == 1:
            raise MemoryError(f"LMCache's CPU buffer has no room for a {tuple(self.block_shape)} block")
        else:
            self._allocate_into(count // 2, parts)
            self._allocate_into(count - count // 2, parts)

    def _offsets(self, parts: list[tuple[Any, int]]) -> list[int]:
        return [obj.meta.address + row * self._block_bytes for obj, count in parts for row in range(count)]

    def _store(self, parts: list[tuple[Any, int]], keys: list[TierKey | None]) -> None:
        """Hand each allocation to LMCache as a run of its blocks' ``keys`` (in order; None: a block not
        kept); one that keeps none is freed."""
        first = 0
        for obj, count in parts:
            kept = [(row, key) for row, key in enumerate(keys[first : first + count]) if key is not None]
            first += count
            if kept:
                run = StoredRun(self._run_key(kept, count), obj.meta.address, len(kept))
                self.backend.submit_put_task(run.lm_key, obj)
                for row, key in kept:
                    self._rows[key] = (run, row)
            obj.ref_count_down()  # LMCache holds its own reference now, or none (freed)

    def _run_key(self, kept: list[tuple[int, TierKey]], count: int) -> Any:
        """A run of one block: the block's chained hash; a longer one: its first kept block's hash and
        a run number. Tagged with its blocks' weight version (versions, were they ever mixed)."""
        versions = ",".join(str(version) for version in sorted({key[0] for _, key in kept}))
        tags = {VERSION_TAG: versions}
        if count > 1:
            tags[RUN_TAG] = str(next(self._run_numbers))
        return self._key_type(MODEL_TAG, 1, 0, kept[0][1][1], self.dtype, tags)

    # reading

    def get(self, key: TierKey) -> torch.Tensor | None:
        offsets, objs = self._hold([key])
        if not offsets:
            return None
        objs[0].ref_count_down()  # the caller copies before the next tier operation (the tier's lock covers both)
        return self._blocks(offsets[0], 1, self.dtype).view(self.block_shape)

    def contains(self, key: TierKey) -> bool:
        offsets, objs = self._hold([key])
        for obj in objs:
            obj.ref_count_down()
        return bool(offsets)

    def read_many_into(self, keys: list[TierKey], out: torch.Tensor) -> int:
        """Copy the blocks of ``keys`` into the rows of ``out`` up to the first one missing; how many."""
        offsets, objs = self._hold(keys[: len(out)])
        try:
            if offsets:
                self._copy_rows(offsets, out[: len(offsets)], into_store=False)
        finally:
            for obj in objs:
                obj.ref_count_down()
        return len(offsets)

    def lend_many(self, keys: list[TierKey]) -> tuple[int, list[torch.Tensor], Callable[[], None]]:
        """The stored bytes of ``keys`` up to the first one missing, without a copy: (how many, views of
        the buffer holding them in order, one per stretch of adjacent blocks, release). Until
        ``release`` is called their runs stay allocated even if deleted meanwhile (LMCache's reference
        count), so a sender may read them while the tier goes on."""
        offsets, objs = self._hold(keys)
        size = self._block_bytes
        views = [self._buffer[offsets[s] : offsets[s] + n * size] for s, n in address_runs(offsets, size)]

        def release() -> None:
            for obj in objs:
                obj.ref_count_down()

        return len(offsets), views, release

    def _hold(self, keys: list[TierKey]) -> tuple[list[int], list[Any]]:
        """Offsets of the blocks of ``keys`` up to the first one missing, and their runs' LMCache
        objects, each referenced once (the caller lets go of them)."""
        offsets: list[int] = []
        held: dict[StoredRun, Any] = {}
        for key in keys:
            entry = self._rows.get(key)
            if entry is None:
                break
            run, row = entry
            if run not in held:
                obj = self.backend.get_blocking(run.lm_key)
                if obj is None:
                    break
                held[run] = obj
            offsets.append(run.offset + row * self._block_bytes)
        return offsets, list(held.values())

    def _blocks(self, offset: int, count: int, dtype: torch.dtype) -> torch.Tensor:
        """``count`` blocks from ``offset`` on, as one flat tensor of ``dtype``."""
        return self._buffer[offset : offset + count * self._block_bytes].view(dtype)

    def _copy_rows(self, offsets: list[int], blocks: torch.Tensor, into_store: bool) -> None:
        """Copy between ``blocks`` (a block per row, in order, any strides) and the blocks at ``offsets``
        in the buffer: one copy per stretch of adjacent blocks."""
        for start, count in address_runs(offsets, self._block_bytes):
            rows = blocks[start : start + count]
            stored = self._blocks(offsets[start], count, rows.dtype).view(rows.shape)
            if into_store:
                stored.copy_(rows)
            else:
                rows.copy_(stored)

    # forgetting

    def delete(self, key: TierKey) -> None:
        entry = self._rows.pop(key, None)
        if entry is None:
            return
        run = entry[0]
        run.live -= 1
        if run.live == 0:
            self.backend.remove(run.lm_key)

    def clear(self) -> None:
        """Drop every run, lent ones too (they are freed when their lender lets go)."""
        runs = {run for run, _ in self._rows.values()}
        self._rows.clear()
        for run in runs:
            self.backend.remove(run.lm_key)
        self.backend.clear()


class Reservation:
    """Room for ``count`` blocks a peer writes in place: LMCache allocations (``parts``: object, blocks
    it holds), each block's offset in the buffer and ``regions`` (address, bytes), a block each, in order."""

    def __init__(self, parts: list[tuple[Any, int]], offsets: list[int], base: int, block_bytes: int) -> None:
        self.parts = parts
        self.offsets = offsets
        self.regions = [(base + offset, block_bytes) for offset in offsets]
        self.count = len(offsets)
        self.open = True
        self.nbytes = 0  # room the tier's index holds for it

    def release(self) -> None:
        """Free the room unused (nothing of it was stored)."""
        Reservation.free(self.parts)

    @staticmethod
    def free(parts: list[tuple[Any, int]]) -> None:
        for obj, _ in parts:
            obj.ref_count_down()


def address_runs(addresses: list[int], stride: int) -> list[tuple[int, int]]:
    """(first index, length) of each run of addresses ``stride`` apart, in order."""
    runs: list[tuple[int, int]] = []
    for index, address in enumerate(addresses):
        if runs and address == addresses[index - 1] + stride:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    return runs
