"""The tier's bytes in psrl's own host buffer: fixed-size block slots, no LMCache.

One buffer of ``capacity_bytes`` (``psrl.kvcache.host_buffer``: 2 MiB aligned, pages resident only once
touched) cut into slots of one block each; a key owns one slot until it is deleted. Offloading and
loading blocks of the engine's own prefix cache is all it does: it cannot lend room for a peer to write
into (``reserve``), so KV transfers between instances need the LMCache store (``psrl.lmcache.store``).

For an engine on a GPU the buffer is page-locked once (``pin=True``): copies between a slot and the
GPU are then queued on the current stream like any kernel and the host never waits for them. A block
queued out of the GPU lands before anything queued after it reads its slot; a slot reused by a later
copy is written only after every read queued before it. Only reading or writing a slot on the host
waits (``wait``) for the copies in flight.
"""

from __future__ import annotations

import math
import time
import weakref
from itertools import takewhile
from typing import Any

import torch

from psrl.kvcache.host_buffer import huge_page_buffer, register_with_cuda, unregister_from_cuda
from psrl.kvcache.index import TierKey
from psrl.kvcache.tier import index_runs
from psrl.log import get_logger


class HostStore:
    """PayloadStore (psrl.kvcache.tier) over slots of one host buffer; every block has the same shape and dtype."""

    def __init__(
        self, capacity_bytes: int, block_shape: tuple[int, ...], dtype: torch.dtype, *, pin: bool = False
    ) -> None:
        block_bytes = math.prod(block_shape) * torch.empty(0, dtype=dtype).element_size()
        num_slots = capacity_bytes // block_bytes
        if num_slots < 1:
            raise ValueError(
                f"an offload tier of {capacity_bytes} bytes holds no {block_bytes}-byte block: "
                "raise psrl.lmcache.offload_size_gb"
            )
        self.block_shape = block_shape
        buffer = huge_page_buffer(num_slots * block_bytes)
        self.pinned = pin and _pin(self, buffer)
        self.slots = buffer.view(dtype).view(num_slots, *block_shape)
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out the lowest slot first
        self._slot_of: dict[TierKey, int] = {}
        self._in_flight: Any = None  # a CUDA event after the last copy queued between a slot and a GPU

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def put_many(self, keys: list[TierKey], kvs: torch.Tensor) -> None:
        if len(keys) > len(self._free):
            raise MemoryError(f"the host tier has {len(self._free)} free slots for {len(keys)} blocks")
        slots = sorted(self._free.pop() for _ in keys)  # ascending: neighbouring slots move in one copy
        self._copy(slots, kvs, into_slots=True)
        self._slot_of.update(zip(keys, slots, strict=True))

    def read_many_into(self, keys: list[TierKey], out: torch.Tensor) -> int:
        slots = list(takewhile(lambda slot: slot is not None, (self._slot_of.get(key) for key in keys[: len(out)])))
        self._copy(slots, out, into_slots=False)  # type: ignore[arg-type]
        return len(slots)

    def contains(self, key: TierKey) -> bool:
        return key in self._slot_of

    def get(self, key: TierKey) -> torch.Tensor | None:
        """The slot's bytes for the host to read (copies into it still in flight land first)."""
        slot = self._slot_of.get(key)
        if slot is None:
            return None
        self.wait()
        return self.slots[slot]

    def delete(self, key: TierKey) -> None:
        slot = self._slot_of.pop(key, None)
        if slot is not None:
            self._free.append(slot)

    def clear(self) -> None:
        self._free = list(range(len(self.slots) - 1, -1, -1))
        self._slot_of.clear()

    def wait(self) -> None:
        """Until every copy queued between the slots and a GPU has run."""
        if self._in_flight is not None:
            self._in_flight.synchronize()
            self._in_flight = None

    def _copy(self, slots: list[int], blocks: torch.Tensor, *, into_slots: bool) -> None:
        """Copy between ``blocks`` (a block per row, in order) and ``slots``: one copy per run of
        neighbouring slots, queued on the GPU's stream when the slots are pinned and the rows on a GPU."""
        queued = self.pinned and blocks.is_cuda
        if not queued:
            self.wait()  # the host touches the slots itself
        row = 0
        for first, count in index_runs(slots):
            stored, rows = self.slots[first : first + count], blocks[row : row + count]
            if into_slots:
                stored.copy_(rows, non_blocking=queued)
            else:
                rows.copy_(stored, non_blocking=queued)
            row += count
        if queued and slots:
            self._in_flight = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._in_flight.record(torch.cuda.current_stream(blocks.device))


def _pin(owner: HostStore, buffer: torch.Tensor) -> bool:
    """Page-lock the tier's buffer for the GPU, unlocked again when ``owner`` goes (the finalizer holds
    the buffer, so its memory outlives the registration)."""
    started = time.perf_counter()
    if not register_with_cuda(buffer):
        return False
    weakref.finalize(owner, unregister_from_cuda, buffer.data_ptr(), buffer)
    get_logger("psrl.kvcache.host_store").info(
        "kv_host_tier_pinned", gib=round(buffer.numel() / 2**30, 2), seconds=round(time.perf_counter() - started, 2)
    )
    return True
