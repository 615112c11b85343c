"""The tier's bookkeeping: version-tagged keys, eviction order, pins and the change journal."""

from __future__ import annotations

import random

import pytest

from psrl.kvcache.index import TierIndex


def test_lru_evicts_the_least_recently_used_and_journals_it() -> None:
    index = TierIndex(300)
    for h in (1, 2, 3):
        assert index.admit((0, h), 100) == []
    index.touch((0, 1))
    assert index.admit((0, 4), 100) == [(0, 2)]
    changes = index.drain_changes()
    assert changes.added == [(0, 1), (0, 3), (0, 4)] and changes.removed == [(0, 2)]
    assert not index.drain_changes()


def test_the_journal_replays_to_the_tier_through_churn() -> None:
    """Keys admitted and evicted (or evicted and readmitted) between two drains: a reader that
    applies each drain (cleared, removed, added) holds exactly the tier's keys, never an evicted one."""
    rng = random.Random(7)
    index = TierIndex(10 * 100)
    view: set[tuple[int, int]] = set()
    for _ in range(300):
        for _ in range(rng.randint(0, 8)):
            action = rng.random()
            if action < 0.8:
                index.admit((rng.randint(0, 1), rng.randint(0, 25)), 100)
            elif action < 0.95:
                index.remove((rng.randint(0, 1), rng.randint(0, 25)))
            else:
                index.clear()
        changes = index.drain_changes()
        if changes.cleared:
            view.clear()
        view.difference_update(changes.removed)
        view.update(changes.added)
        assert view == set(index.keys())


def test_fifo_ignores_hits() -> None:
    index = TierIndex(200, "FIFO")
    index.admit((0, 1), 100)
    index.admit((0, 2), 100)
    index.touch((0, 1))
    assert index.admit((0, 3), 100) == [(0, 1)]


def test_versions_are_distinct_keys() -> None:
    index = TierIndex(1000)
    index.admit((3, 42), 10)
    assert (3, 42) in index and (4, 42) not in index


def test_pinned_keys_are_never_victims_and_a_full_pinned_tier_refuses() -> None:
    index = TierIndex(200)
    index.admit((0, 1), 100)
    index.admit((0, 2), 100)
    assert index.pin("t1", [(0, 1), (0, 2), (0, 9)]) == 2
    assert index.admit((0, 3), 100) is None
    assert not index.remove((0, 1))
    index.unpin("t1")
    assert index.admit((0, 3), 100) == [(0, 1)]


def test_two_owners_pin_the_same_key() -> None:
    index = TierIndex(100)
    index.admit((0, 1), 100)
    index.pin("a", [(0, 1)])
    index.pin("b", [(0, 1)])
    index.unpin("a")
    assert index.is_pinned((0, 1))
    index.unpin("b")
    assert not index.is_pinned((0, 1))


def test_clear_drops_everything_and_says_so() -> None:
    index = TierIndex(100)
    index.admit((0, 1), 50)
    index.pin("a", [(0, 1)])
    assert index.clear() == [(0, 1)]
    changes = index.drain_changes()
    assert changes.cleared and not changes.added
    assert index.used_bytes == 0 and not index.pin_owners


def test_oversized_entry_and_bad_capacity() -> None:
    assert TierIndex(10).admit((0, 1), 11) is None
    with pytest.raises(ValueError, match="capacity"):
        TierIndex(0)


def test_pins_stop_at_the_budget() -> None:
    index = TierIndex(1000, pin_budget=2)
    for h in range(4):
        index.admit((0, h), 10)
    assert index.pin("a", [(0, 0), (0, 1), (0, 2)]) == 2
    assert index.pin("b", [(0, 1), (0, 3)]) == 1  # (0, 1) is already pinned: sharing costs no budget


def test_unpinning_some_keys_keeps_the_rest_pinned() -> None:
    index = TierIndex(1000)
    for h in range(3):
        index.admit((0, h), 10)
    index.pin("t", [(0, 0), (0, 1), (0, 2)])
    index.unpin_keys("t", [(0, 0), (0, 1)])
    assert not index.is_pinned((0, 0)) and index.is_pinned((0, 2)) and index.pin_owners == ["t"]
    index.unpin_keys("t", [(0, 2)])
    assert not index.is_pinned((0, 2)) and index.pin_owners == []
