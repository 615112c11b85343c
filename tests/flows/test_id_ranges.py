"""IdRanges holds exactly the ids added, as few ranges as they allow."""

from __future__ import annotations

import random

from psrl.flows.id_ranges import IdRanges


def test_ascending_runs_collapse_into_one_range() -> None:
    ids = IdRanges(range(1000, 5000))
    assert ids.num_ranges == 1 and len(ids) == 4000
    assert 999 not in ids and 1000 in ids and 4999 in ids and 5000 not in ids


def test_any_order_holds_exactly_the_ids_added() -> None:
    rng = random.Random(3)
    added = set(rng.sample(range(300), 200))
    ids = IdRanges()
    for id_ in rng.sample(sorted(added), len(added)):
        ids.add(id_)
        ids.add(id_)  # a second add changes nothing
    assert [i for i in range(-5, 310) if i in ids] == sorted(added)
    assert len(ids) == len(added)
    runs = sum(1 for i in sorted(added) if i - 1 not in added)
    assert ids.num_ranges == runs


def test_a_gap_filled_later_joins_its_neighbours() -> None:
    ids = IdRanges([1, 2, 4, 5])
    assert ids.num_ranges == 2
    ids.add(3)
    assert ids.num_ranges == 1 and len(ids) == 5
