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
from typing import Any

import torch

from psrl.errors import MissingExtraError
from psrl.kvcache.index import TierKey

MODEL_TAG = "psrl"
VERSION_TAG = "lmcache.tag.weight_version"
ALIGN_BYTES = 4096  # LMCache's allocator rounds every allocation up to this


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
        buffer = torch.empty((capacity_bytes // block_bytes + 1) * aligned, dtype=torch.uint8)
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
