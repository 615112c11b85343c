"""The tier's bytes in LMCache's CPU backend (``LocalCPUBackend`` over one preallocated buffer).

Each entry is an LMCache ``CacheEngineKey`` whose chunk hash is the block's chained hash and
whose tag ``lmcache.tag.weight_version`` is the version that computed it: LMCache itself keys
the two apart, so even a lookup that bypassed psrl's index could not cross versions. psrl's
``TierIndex`` decides eviction (it knows about pins); LMCache's allocator is asked never to
evict on its own.

Needs the optional ``lmcache`` package (extra ``kv``).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch

from psrl.errors import MissingExtraError
from psrl.kvcache.index import TierKey

MODEL_TAG = "psrl"
VERSION_TAG = "lmcache.tag.weight_version"
ALIGN_BYTES = 4096  # LMCache's allocator rounds every allocation up to this
# room for blocks lent to a KV server's sends that the index has evicted meanwhile: three of a
# fetch's largest pieces (psrl.kvcache.transfer.client.MAX_PIECE_BLOCKS), the one on the wire and
# the two asked ahead; pages of it become resident only once a block is stored there
LEND_HEADROOM_BLOCKS = 192


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


class LmcacheStore:
    """PayloadStore over LMCache's LocalCPUBackend; every block has the same shape and dtype."""

    def __init__(self, capacity_bytes: int, block_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        lm = _import_lmcache()
        self._key_type = lm["key"]
        self._format = lm["format"].KV_2LTD
        self.block_shape = torch.Size(block_shape)
        self.dtype = dtype
        # room for as many blocks as the index admits, each rounded up to the allocator's alignment
        block_bytes = self.block_shape.numel() * dtype.itemsize
        aligned = -(-block_bytes // ALIGN_BYTES) * ALIGN_BYTES
        self.lend_headroom_blocks = LEND_HEADROOM_BLOCKS
        buffer = torch.empty((capacity_bytes // block_bytes + 1 + LEND_HEADROOM_BLOCKS) * aligned, dtype=torch.uint8)
        self._buffer, self._block_bytes, self._aligned_bytes = buffer, block_bytes, aligned
        config = lm["config"].from_defaults(
            chunk_size=int(block_shape[1]), local_cpu=True, max_local_cpu_size=buffer.numel() / 1024**3
        )
        self.backend = lm["backend"](config, memory_allocator=lm["allocator"](buffer))
        # hand LMCache its references back before the buffer goes, or it warns about each one
        weakref.finalize(self, self.backend.clear)

    def put(self, key: TierKey, kv: torch.Tensor) -> None:
        obj = self.backend.allocate(self.block_shape, self.dtype, self._format, eviction=False)
        if obj is None or obj.tensor is None:
            raise MemoryError(f"LMCache's CPU buffer has no room for a {tuple(self.block_shape)} block")
        obj.tensor.copy_(kv.view(self.block_shape) if kv.is_contiguous() else kv)
        self.backend.submit_put_task(self._lm_key(key), obj)
        obj.ref_count_down()  # the backend holds its own reference now

    def put_many(self, keys: list[TierKey], kvs: torch.Tensor) -> None:
        """``kvs`` [len(keys), *block_shape]: one allocation for the run when LMCache finds contiguous
        room for it, a copy per run of adjacent allocations, one hand-over."""
        objs = self._allocate(len(keys))
        self._copy_runs([obj.meta.address for obj in objs], kvs, into_store=True)
        self.adopt(keys, objs)

    def read_many_into(self, keys: list[TierKey], out: torch.Tensor) -> int:
        """Copy the blocks of ``keys`` into the rows of ``out`` up to the first one missing; how many."""
        objs = []
        for key in keys:
            obj = self.backend.get_blocking(self._lm_key(key))  # held (ref counted) until copied
            if obj is None:
                break
            objs.append(obj)
        try:
            if objs:
                self._copy_runs([obj.meta.address for obj in objs], out[: len(objs)], into_store=False)
        finally:
            for obj in objs:
                obj.ref_count_down()
        return len(objs)

    def lend_many(self, keys: list[TierKey]) -> tuple[int, list[torch.Tensor], Callable[[], None]]:
        """The stored bytes of ``keys`` up to the first one missing, without a copy: (how many, views
        of the buffer holding them back to back (one per run of adjacent allocations), release).
        Until ``release`` is called the blocks stay allocated even if deleted meanwhile (LMCache's
        reference count), so a sender may read them while the tier goes on."""
        objs = []
        for key in keys:
            obj = self.backend.get_blocking(self._lm_key(key))
            if obj is None:
                break
            objs.append(obj)
        addresses = [obj.meta.address for obj in objs]
        views = []
        for start, count in address_runs(addresses, self._aligned_bytes):
            if self._aligned_bytes == self._block_bytes:
                views.append(self._buffer[addresses[start] : addresses[start] + count * self._block_bytes])
            else:  # padded allocations: a view per block
                views.extend(self._buffer[a : a + self._block_bytes] for a in addresses[start : start + count])

        def release() -> None:
            for obj in objs:
                obj.ref_count_down()

        return len(objs), views, release

    @property
    def memory(self) -> torch.Tensor:
        """The one buffer every block lives in (a peer's NIXL agent writes into it, or reads from it)."""
        return self._buffer

    def reserve(self, count: int) -> Reservation:
        """Allocations for ``count`` blocks that a peer writes in place; ``adopt`` or release them."""
        objs = self._allocate(count)
        base = int(self._buffer.data_ptr())
        return Reservation(objs, [(base + obj.meta.address, self._block_bytes) for obj in objs])

    def reserved_view(self, reservation: Reservation, count: int) -> torch.Tensor | None:
        """The first ``count`` allocations of ``reservation`` as one view of the buffer (bytes) when they
        lie back to back unpadded, so a peer's bytes can be received straight into them; else None."""
        addresses = [obj.meta.address for obj in reservation.objs[:count]]
        if not addresses or self._aligned_bytes != self._block_bytes:
            return None
        if address_runs(addresses, self._aligned_bytes) != [(0, count)]:
            return None
        return self._buffer[addresses[0] : addresses[0] + count * self._block_bytes]

    def write_reserved(self, reservation: Reservation, first: int, rows: torch.Tensor) -> None:
        """Copy ``rows`` (one block each, contiguous) into the allocations of ``reservation`` from ``first`` on."""
        addresses = [obj.meta.address for obj in reservation.objs[first : first + len(rows)]]
        if len(addresses) < len(rows):
            raise ValueError(f"{len(rows)} blocks from allocation {first} on, {len(reservation.objs)} reserved")
        self._copy_runs(addresses, rows, into_store=True)

    def _allocate(self, count: int) -> list[Any]:
        """``count`` block allocations, adjacent when LMCache finds the room (never evicting: the index does)."""
        objs = self.backend.batched_allocate(self.block_shape, self.dtype, count, self._format, eviction=False)
        if objs is None:  # fragmented: block by block
            objs = [self.backend.allocate(self.block_shape, self.dtype, self._format, eviction=False)
                    for _ in range(count)]  # fmt: skip
        if any(obj is None for obj in objs):
            for obj in objs:
                if obj is not None:
                    obj.ref_count_down()
            raise MemoryError(f"LMCache's CPU buffer has no room for {count} {tuple(self.block_shape)} blocks")
        return list(objs)

    def adopt(self, keys: list[TierKey], objs: list[Any]) -> None:
        """Store reserved allocations (written meanwhile) under ``keys``."""
        self.backend.batched_submit_put_task([self._lm_key(key) for key in keys], objs)
        for obj in objs:
            obj.ref_count_down()  # the backend holds its own reference now

    def _copy_runs(self, addresses: list[int], blocks: torch.Tensor, into_store: bool) -> None:
        """Copy between ``blocks`` (rows in order) and the allocations at ``addresses`` in the buffer:
        one strided copy per run of adjacent allocations rather than a tensor per block (LMCache's
        per-object views cost more than the bytes of a block)."""
        if not blocks.is_contiguous():
            raise ValueError("blocks must be contiguous: one block per row, back to back")
        rows = blocks.view(torch.uint8).view(len(addresses), self._block_bytes)
        for start, count in address_runs(addresses, self._aligned_bytes):
            stored = self._buffer.as_strided((count, self._block_bytes), (self._aligned_bytes, 1), addresses[start])
            if into_store:
                stored.copy_(rows[start : start + count])
            else:
                rows[start : start + count].copy_(stored)

    def get(self, key: TierKey) -> torch.Tensor | None:
        obj = self.backend.get_blocking(self._lm_key(key))
        if obj is None:
            return None
        tensor: torch.Tensor = obj.tensor
        try:
            return tensor
        finally:
            # the caller copies before the next tier operation (the tier's lock covers both)
            obj.ref_count_down()

    def delete(self, key: TierKey) -> None:
        self.backend.remove(self._lm_key(key))

    def clear(self) -> None:
        self.backend.clear()

    def _lm_key(self, key: TierKey) -> Any:
        version, block_hash = key
        return self._key_type(MODEL_TAG, 1, 0, block_hash, self.dtype, {VERSION_TAG: str(version)})


class Reservation:
    """Allocations reserved for blocks a peer writes in place: ``regions`` (address, bytes), a block each."""

    def __init__(self, objs: list[Any], regions: list[tuple[int, int]]) -> None:
        self.objs = objs
        self.regions = regions
        self.open = True
        self.nbytes = 0  # room the tier's index holds for it

    def release(self, objs: list[Any]) -> None:
        for obj in objs:
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
