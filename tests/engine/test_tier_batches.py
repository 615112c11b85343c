"""Copies between the KV cache and the offload tier are decided block by block and run in batches.

A block given up is stored as it was when given up, even if a load reuses it before the copies run;
a block loaded gets what the tier held when it was loaded, even if the tier drops it before they run;
more blocks given up than the tier holds keep the last ones, as storing them one by one would.
"""

from __future__ import annotations

import pytest
import torch

from psrl.engine.block_manager import Block
from psrl.engine.kv_offload import EngineOffload, make_tier
from psrl.kvcache.host_store import HostStore

# on a GPU the tier is pinned and every copy is queued on the stream (the host never waits)
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=GPU),
]
Tiered = tuple[torch.Tensor, EngineOffload]
LAYERS, BLOCKS, BLOCK_SHAPE = 2, 8, (4, 2, 1, 3)  # block size 4, keys and values, 1 head of 3


def cache(device: str = "cpu") -> torch.Tensor:
    """Block b of the cache is filled with b everywhere."""
    kv = torch.zeros(LAYERS, BLOCKS + 1, *BLOCK_SHAPE, device=device)
    for block_id in range(BLOCKS + 1):
        kv[:, block_id] = float(block_id)
    return kv


def offload_of(kv: torch.Tensor, tier_blocks: int = 16) -> EngineOffload:
    block_bytes = kv[:, 0].numel() * kv.element_size()
    pin = kv.is_cuda
    tier = make_tier(tier_blocks * block_bytes, tuple(kv[:, 0].shape), kv.dtype, "LRU", store="host", pin=pin)
    assert tier.store.pinned == pin  # type: ignore[attr-defined]
    return EngineOffload(tier, kv, version_of=lambda: 0)


def block(block_id: int, block_hash: int) -> Block:
    return Block(block_id, hash=block_hash, token_ids=(block_hash,))


@pytest.fixture(params=DEVICES)
def tiered(request: pytest.FixtureRequest) -> Tiered:
    """A cache on each device and its offload tier."""
    kv = cache(request.param)
    return kv, offload_of(kv)


def store(offload: EngineOffload, *block_ids: int) -> None:
    """Give up these blocks (block b under hash 100 + b) and run the copies."""
    for block_id in block_ids:
        offload.offload(block(block_id, 100 + block_id))
    offload.flush()


def filled_with(kv: torch.Tensor, block_id: int) -> float:
    """The one value block ``block_id`` holds everywhere."""
    values = kv[:, block_id].unique()
    assert len(values) == 1, values
    return float(values.item())


def test_a_block_given_up_then_reused_by_a_load_is_stored_as_it_was(tiered: Tiered) -> None:
    kv, offload = tiered
    store(offload, 1)
    offload.offload(block(2, 102))  # block 2 given up, then filled with the tier's copy of block 1
    assert offload.load([2], [101], [(101,)]) == 1
    assert filled_with(kv, 2) == 2.0  # nothing ran yet
    offload.flush()
    assert filled_with(kv, 2) == 1.0
    assert offload.load([3], [102], [(102,)]) == 1
    offload.flush()
    assert filled_with(kv, 3) == 2.0


def test_a_load_gets_what_the_tier_held_when_it_was_loaded(tiered: Tiered) -> None:
    kv, offload = tiered
    store(offload, 5)
    assert offload.load([6], [105], [(105,)]) == 1
    offload.tier.clear()
    offload.flush()
    assert filled_with(kv, 6) == 5.0


def test_a_load_stops_at_the_first_block_the_tier_lacks_or_holds_for_other_tokens(tiered: Tiered) -> None:
    kv, offload = tiered
    store(offload, 1, 2, 3)
    assert offload.held_prefix([101, 102, 109, 103], [(101,), (102,), (109,), (103,)]) == 2
    assert offload.load([4, 5, 6], [101, 102, 103], [(101,), (999,), (103,)]) == 1
    offload.flush()
    assert (filled_with(kv, 4), filled_with(kv, 5)) == (1.0, 5.0)  # block 5 untouched


@pytest.mark.parametrize("device", DEVICES)
def test_more_blocks_given_up_than_the_tier_holds_keep_the_last_ones(device: str) -> None:
    offload = offload_of(cache(device), tier_blocks=3)
    store(offload, *range(1, 7))
    held = offload.tier.keys()
    assert sorted(block_hash for _, block_hash in held) == [104, 105, 106]
    assert offload.tier.stats.num_refused == 0


def test_a_block_loaded_then_given_up_before_the_copies_ran_is_stored_with_what_was_loaded(tiered: Tiered) -> None:
    kv, offload = tiered
    store(offload, 1)
    assert offload.load([7], [101], [(101,)]) == 1
    offload.offload(block(7, 201))  # the load into 7 must land before 7 is gathered
    offload.flush()
    assert offload.load([8], [201], [(201,)]) == 1
    offload.flush()
    assert filled_with(kv, 8) == 1.0


def test_the_host_store_moves_neighbouring_slots_together_and_scattered_ones_apart() -> None:
    store = HostStore(6 * 4 * 4, (2, 2), torch.float32)
    rows = torch.arange(24, dtype=torch.float32).view(6, 2, 2)
    store.put_many([(0, k) for k in range(6)], rows)
    for k in (1, 4):
        store.delete((0, k))
    store.put_many([(1, 1), (1, 4)], -rows[:2])  # scattered slots 1 and 4
    out = torch.zeros(4, 2, 2)
    assert store.read_many_into([(0, 0), (1, 1), (0, 2), (1, 4)], out) == 4
    assert torch.equal(out, torch.stack([rows[0], -rows[0], rows[2], -rows[1]]))
    assert store.read_many_into([(0, 5), (0, 1), (0, 3)], out) == 1
