"""The tier's blocks in LMCache runs: blocks that arrive together share one LMCache object.

What the runs must not change: every block reads back as written, a run lives until its last
block is deleted (and while a sender still holds it), the tier makes room by evicting further when
deleted blocks still hold theirs, and no run ever hands a block to another weight version.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lmcache", reason="needs the kv extra: pip install -c constraints.txt -e '.[kv]'")
pytestmark = pytest.mark.kv

from psrl.engine.kv_offload import make_tier  # noqa: E402
from psrl.kvcache import lmcache_store  # noqa: E402
from psrl.kvcache.tier import KvTier  # noqa: E402

SHAPE = (2, 16, 2, 2, 16)  # 8 KiB a block: runs of them lie back to back
BLOCK_BYTES = torch.Size(SHAPE).numel() * 4


def blocks(count: int, first: int = 0) -> torch.Tensor:
    return torch.stack([torch.full(SHAPE, float(first + i)) for i in range(count)])


def keys_of(count: int, first: int = 0, version: int = 1) -> list[tuple[int, int]]:
    return [(version, 1000 + i) for i in range(first, first + count)]


def tokens_of(count: int, first: int = 0) -> list[tuple[int, ...]]:
    return [(first + i,) for i in range(count)]


def tier_of(num_blocks: int, headroom: int, monkeypatch: pytest.MonkeyPatch) -> KvTier:
    monkeypatch.setattr(lmcache_store, "LEND_HEADROOM_BLOCKS", headroom)
    return make_tier(num_blocks * BLOCK_BYTES, SHAPE, torch.float32, "LRU")


def assert_holds(tier: KvTier, keys: list[tuple[int, int]], values: list[float]) -> None:
    out = torch.empty(SHAPE)
    for key, value in zip(keys, values, strict=True):
        tokens = tier._tokens[key]
        assert tier.get_into(key, tokens, out) and torch.equal(out, torch.full(SHAPE, value)), key


def test_blocks_stored_together_are_one_run_until_the_last_is_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    tier = tier_of(16, 4, monkeypatch)
    keys = keys_of(8)
    assert tier.put_many(keys, tokens_of(8), blocks(8)) == 8
    store = tier.store
    assert store.num_runs == 1 and len(store.backend.hot_cache) == 1  # type: ignore[attr-defined]
    assert_holds(tier, keys, [float(i) for i in range(8)])
    for key in keys[:7]:
        store.delete(key)
        assert len(store.backend.hot_cache) == 1  # type: ignore[attr-defined]
    assert store.get(keys[7]) is not None and torch.equal(store.get(keys[7]), torch.full(SHAPE, 7.0))  # type: ignore[arg-type]
    store.delete(keys[7])
    assert store.num_runs == 0 and len(store.backend.hot_cache) == 0  # type: ignore[attr-defined]


def test_a_landed_reservation_is_one_run_and_what_was_not_kept_goes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    tier = tier_of(16, 0, monkeypatch)
    reservation = tier.reserve(6)
    assert [address for address, _ in reservation.regions] == [
        reservation.regions[0][0] + i * BLOCK_BYTES for i in range(6)
    ]
    tier.store.write_reserved(reservation, 0, blocks(4))  # type: ignore[attr-defined]
    assert tier.land_reserved(keys_of(4), tokens_of(4), reservation) == 4
    assert tier.store.num_runs == 1 and tier.index.reserved_bytes == 0  # type: ignore[attr-defined]
    assert_holds(tier, keys_of(4), [0.0, 1.0, 2.0, 3.0])
    empty = tier.reserve(3)
    tier.release_reserved(empty)
    # the room of the two blocks not kept comes back with the run: the whole buffer is free again
    tier.clear()
    whole = tier.reserve(16)
    assert len(whole.parts) == 1
    tier.release_reserved(whole)


def test_a_lent_run_outlives_its_eviction_and_a_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    tier = tier_of(8, 0, monkeypatch)
    keys = keys_of(8)
    tier.put_many(keys, tokens_of(8), blocks(8))
    tokens, views, release = tier.lend_many(keys)
    assert len(tokens) == 8 and len(views) == 1
    tier.clear()
    assert len(tier) == 0
    with pytest.raises(MemoryError):  # the lent run still holds the buffer
        tier.reserve(8)
    sent = torch.cat(views).view(torch.float32).view(8, *SHAPE)
    assert torch.equal(sent, blocks(8))
    release()
    tier.release_reserved(tier.reserve(8))  # and gives it back once released


def test_deleted_blocks_holding_room_make_the_tier_evict_further(monkeypatch: pytest.MonkeyPatch) -> None:
    """No headroom: a run of 8 fills the buffer but for one block. The index evicts one block of the
    run per new block, which frees nothing while the run lives, so the tier evicts on, in LRU order,
    until the run goes; it never claims a block the store does not hold."""
    tier = tier_of(8, 0, monkeypatch)
    tier.put_many(keys_of(8), tokens_of(8), blocks(8))
    tier.drain_changes()
    assert tier.put((2, 1), (100,), torch.full(SHAPE, 100.0))  # the buffer's spare block
    assert tier.put((2, 2), (101,), torch.full(SHAPE, 101.0))  # only once the whole run is gone
    assert tier.keys() == [(2, 1), (2, 2)] and tier.used_bytes == 2 * BLOCK_BYTES
    assert sorted(tier.drain_changes().removed) == keys_of(8)
    assert_holds(tier, [(2, 1), (2, 2)], [100.0, 101.0])
    assert tier.store.num_runs == 2  # type: ignore[attr-defined]


def test_no_room_to_be_had_refuses_and_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    tier = tier_of(4, 0, monkeypatch)
    tier.put_many(keys_of(4), tokens_of(4), blocks(4))
    assert tier.pin("p", keys_of(4)) == 4
    assert tier.put_many(keys_of(2, first=10), tokens_of(2), blocks(2)) == 0
    assert tier.keys() == keys_of(4) and tier.stats.num_refused >= 1


def test_a_fragmented_buffer_splits_a_reservation_and_every_block_still_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    tier = tier_of(8, 0, monkeypatch)
    for index in range(8):  # a block a run: the buffer holds one more
        assert tier.put((5, index), (index,), torch.full(SHAPE, float(index)))
    for index in range(0, 8, 2):
        tier.index.remove((5, index))
        tier._forget((5, index))
    reservation = tier.reserve(4)  # holes of one block each
    assert len(reservation.parts) > 1 and sum(count for _, count in reservation.parts) == 4
    tier.store.write_reserved(reservation, 0, blocks(4, first=50))  # type: ignore[attr-defined]
    assert tier.land_reserved(keys_of(4, first=50), tokens_of(4, first=50), reservation) == 4
    assert_holds(tier, keys_of(4, first=50), [50.0, 51.0, 52.0, 53.0])


def test_a_run_is_tagged_with_its_version_and_never_found_under_another(monkeypatch: pytest.MonkeyPatch) -> None:
    tier = tier_of(16, 0, monkeypatch)
    tier.put_many(keys_of(4, version=3), tokens_of(4), blocks(4))
    (lm_key,) = tier.store.backend.hot_cache  # type: ignore[attr-defined]
    assert dict(lm_key.tags)["weight_version"] == "3"
    out = torch.empty(SHAPE)
    assert not tier.get_into((4, keys_of(1, version=3)[0][1]), (0,), out)
    assert tier.get_into(keys_of(1, version=3)[0], (0,), out)


def test_a_block_stored_on_its_own_keeps_its_own_lmcache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    tier = tier_of(4, 0, monkeypatch)
    tier.store.put((7, 1234), torch.full(SHAPE, 3.0))  # type: ignore[attr-defined]
    (lm_key,) = tier.store.backend.hot_cache  # type: ignore[attr-defined]
    assert lm_key.chunk_hash == 1234 and dict(lm_key.tags) == {"weight_version": "7"}
    assert torch.equal(tier.store.get((7, 1234)), torch.full(SHAPE, 3.0))  # type: ignore[arg-type]
