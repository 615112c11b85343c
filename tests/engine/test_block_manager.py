"""The paged allocator and prefix cache on their own (no model)."""

from __future__ import annotations

import pytest

from psrl.engine import SamplingParams
from psrl.engine import block_manager as block_manager_module
from psrl.engine.block_manager import BlockManager
from psrl.engine.sequence import Sequence


def _seq(token_ids: list[int], name: str = "s") -> Sequence:
    return Sequence(name, list(token_ids), SamplingParams(), arrival_index=0)


def _compute_all(manager: BlockManager, seq: Sequence) -> None:
    """Pretend a step computed every token of `seq`."""
    seq.num_computed_tokens = seq.num_tokens
    manager.hash_blocks(seq)


class TestAllocation:
    def test_allocate_covers_every_token_and_deallocate_frees(self) -> None:
        manager = BlockManager(num_blocks=8, block_size=4)
        seq = _seq(list(range(10)))
        assert manager.can_allocate(seq)
        manager.allocate(seq)
        assert len(seq.block_table) == 3 and manager.num_free_blocks == 5
        manager.deallocate(seq)
        assert seq.block_table == [] and manager.num_free_blocks == 8

    def test_can_allocate_refuses_when_blocks_are_short(self) -> None:
        manager = BlockManager(num_blocks=2, block_size=4)
        assert not manager.can_allocate(_seq(list(range(9))))

    def test_append_takes_a_block_only_at_a_block_boundary(self) -> None:
        manager = BlockManager(num_blocks=3, block_size=4)
        seq = _seq(list(range(4)))
        manager.allocate(seq)
        seq.token_ids.append(99)
        assert manager.can_append(seq)
        manager.may_append(seq)
        assert len(seq.block_table) == 2
        seq.token_ids.append(100)
        manager.may_append(seq)
        assert len(seq.block_table) == 2


class TestPrefixCache:
    def test_full_computed_blocks_are_shared_and_the_last_token_recomputed(self) -> None:
        manager = BlockManager(num_blocks=16, block_size=4)
        first = _seq(list(range(12)), "a")
        manager.allocate(first)
        _compute_all(manager, first)
        second = _seq(list(range(12)), "b")
        manager.allocate(second)
        # 12 tokens = 3 full blocks, but the block with the last token is recomputed
        assert second.num_cached_tokens == 8 and second.block_table[:2] == first.block_table[:2]
        assert second.block_table[2] != first.block_table[2]
        assert manager.blocks[first.block_table[0]].ref_count == 2
        assert manager.stats.num_hit_tokens == 8 and manager.stats.num_queried_tokens == 24

    def test_blocks_not_yet_computed_are_not_shared(self) -> None:
        manager = BlockManager(num_blocks=16, block_size=4)
        first = _seq(list(range(12)), "a")
        manager.allocate(first)
        second = _seq(list(range(12)), "b")
        manager.allocate(second)
        assert second.num_cached_tokens == 0

    def test_a_hit_needs_the_whole_prefix_to_match(self) -> None:
        manager = BlockManager(num_blocks=16, block_size=4)
        first = _seq(list(range(12)), "a")
        manager.allocate(first)
        _compute_all(manager, first)
        shifted = _seq([0, 1, 2, 3, 40, 41, 42, 43, 8, 9, 10, 11, 12], "b")
        manager.allocate(shifted)
        assert shifted.num_cached_tokens == 4

    def test_a_block_only_hits_at_the_same_position(self) -> None:
        manager = BlockManager(num_blocks=16, block_size=4)
        first = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
        manager.allocate(first)
        _compute_all(manager, first)
        # same tokens as first's second block, but as a first block: its keys were computed at other positions
        moved = _seq([5, 6, 7, 8, 9], "b")
        manager.allocate(moved)
        assert moved.num_cached_tokens == 0

    def test_hash_collision_is_caught_by_token_comparison(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(block_manager_module, "chained_hash", lambda parent, tokens: 7)
        manager = BlockManager(num_blocks=16, block_size=4)
        first = _seq([1, 2, 3, 4, 5], "a")
        manager.allocate(first)
        _compute_all(manager, first)
        other = _seq([9, 9, 9, 9, 5], "b")
        manager.allocate(other)
        assert other.num_cached_tokens == 0

    def test_freed_blocks_still_hit_until_reused(self) -> None:
        manager = BlockManager(num_blocks=4, block_size=4)
        first = _seq(list(range(9)), "a")
        manager.allocate(first)
        _compute_all(manager, first)
        manager.deallocate(first)
        again = _seq(list(range(9)), "b")
        manager.allocate(again)
        assert again.num_cached_tokens == 8
        manager.deallocate(again)
        # a sequence that needs every block overwrites the cached ones
        filler = _seq([50 + i for i in range(16)], "c")
        manager.allocate(filler)
        manager.deallocate(filler)
        late = _seq(list(range(9)), "d")
        manager.allocate(late)
        assert late.num_cached_tokens == 0

    def test_reset_starts_a_new_epoch_and_old_blocks_are_never_registered(self) -> None:
        manager = BlockManager(num_blocks=16, block_size=4)
        running = _seq(list(range(6)), "a")
        manager.allocate(running)
        _compute_all(manager, running)
        manager.reset_prefix_cache()
        # the running sequence fills its second block after the reset: it must stay private
        running.token_ids += [6, 7, 8]
        manager.may_append(running)
        _compute_all(manager, running)
        probe = _seq(list(range(9)), "b")
        manager.allocate(probe)
        assert probe.num_cached_tokens == 0

    def test_disabled_prefix_cache_never_hits(self) -> None:
        manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
        first = _seq(list(range(12)), "a")
        manager.allocate(first)
        _compute_all(manager, first)
        second = _seq(list(range(12)), "b")
        manager.allocate(second)
        assert second.num_cached_tokens == 0 and manager.stats.hit_rate == 0.0
