"""The tier's bytes in psrl's own host buffer: fixed-size block slots, no LMCache.

One buffer of ``capacity_bytes`` (``psrl.kvcache.host_buffer``: 2 MiB aligned, pages resident only once
touched) cut into slots of one block each; a key owns one slot until it is deleted. Offloading and
loading blocks of the engine's own prefix cache is all it does: it cannot lend room for a peer to write
into (``reserve``), so KV transfers between instances need the LMCache store (``psrl.lmcache.store``).
"""

from __future__ import annotations

import math

import torch

from psrl.kvcache.host_buffer import huge_page_buffer
from psrl.kvcache.index import TierKey


class HostStore:
    """PayloadStore (psrl.kvcache.tier) over slots of one host buffer; every block has the same shape and dtype."""

    def __init__(self, capacity_bytes: int, block_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        block_bytes = math.prod(block_shape) * torch.empty(0, dtype=dtype).element_size()
        num_slots = capacity_bytes // block_bytes
        if num_slots < 1:
            raise ValueError(
                f"an offload tier of {capacity_bytes} bytes holds no {block_bytes}-byte block: "
                "raise psrl.lmcache.offload_size_gb"
            )
        self.block_shape = block_shape
        self.slots = huge_page_buffer(num_slots * block_bytes).view(dtype).view(num_slots, *block_shape)
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out the lowest slot first
        self._slot_of: dict[TierKey, int] = {}

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def put_many(self, keys: list[TierKey], kvs: torch.Tensor) -> None:
        if len(keys) > len(self._free):
            raise MemoryError(f"the host tier has {len(self._free)} free slots for {len(keys)} blocks")
        for row, key in enumerate(keys):
            slot = self._free.pop()
            self.slots[slot].copy_(kvs[row])
            self._slot_of[key] = slot

    def read_many_into(self, keys: list[TierKey], out: torch.Tensor) -> int:
        for row, key in enumerate(keys):
            slot = self._slot_of.get(key)
            if slot is None:
                return row
            out[row].copy_(self.slots[slot])
        return len(keys)

    def get(self, key: TierKey) -> torch.Tensor | None:
        slot = self._slot_of.get(key)
        return None if slot is None else self.slots[slot]

    def delete(self, key: TierKey) -> None:
        slot = self._slot_of.pop(key, None)
        if slot is not None:
            self._free.append(slot)

    def clear(self) -> None:
        self._free = list(range(len(self.slots) - 1, -1, -1))
        self._slot_of.clear()
