"""Request queue order: single heap and multi-level queue."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psrl.routing import UNVERSIONED, RequestQueue, RoutingRequest


def req(rid: int, version: int = UNVERSIONED, *, tokens: int = 10, is_validate: bool = False) -> RoutingRequest:
    return RoutingRequest(rid, rid, version_tag=version, num_prompt_tokens=tokens, is_validate=is_validate)


def drain(queue: RequestQueue) -> list[int]:
    order = []
    while (item := queue.pop()) is not None:
        order.append(item[0].request_id)
    return order


class TestSingleHeap:
    def test_continuations_of_older_trajectories_first_then_new_requests(self) -> None:
        queue = RequestQueue()
        for r in (req(1), req(2, 3), req(3, 1), req(4), req(5, 1)):
            queue.push(r)
        assert drain(queue) == [3, 5, 2, 1, 4]

    def test_validation_outranks_versions(self) -> None:
        queue = RequestQueue()
        queue.push(req(1, 0))
        queue.push(req(2, 5, is_validate=True))
        assert drain(queue) == [2, 1]

    @pytest.mark.parametrize(
        ("indicator", "expected"),
        [("small_id", [1, 2, 3]), ("short_length", [2, 3, 1]), ("long_length", [1, 3, 2])],
    )
    def test_sort_indicator_orders_within_a_version(self, indicator: str, expected: list[int]) -> None:
        queue = RequestQueue(sort_indicator=indicator)  # type: ignore[arg-type]
        for rid, tokens in ((3, 50), (1, 90), (2, 10)):
            queue.push(req(rid, tokens=tokens))
        assert drain(queue) == expected

    def test_equal_keys_are_first_in_first_out_and_push_back_keeps_the_place(self) -> None:
        queue = RequestQueue(sort_indicator="short_length")
        arrivals = {rid: queue.push(req(rid)) for rid in (7, 5, 6)}
        first = queue.pop()
        assert first is not None and first[0].request_id == 7
        queue.push(first[0], arrivals[7])  # a failed selection puts it back
        assert drain(queue) == [7, 5, 6]

    def test_unknown_sort_indicator_is_refused(self) -> None:
        with pytest.raises(ValueError, match="request_sort_indicator"):
            RequestQueue(sort_indicator="largest")  # type: ignore[arg-type]

    def test_remove_drops_only_that_request(self) -> None:
        queue = RequestQueue()
        for rid in (1, 2, 3):
            queue.push(req(rid))
        assert queue.remove(2) and not queue.remove(2)
        assert len(queue) == 2 and 2 not in queue
        assert sorted(r.request_id for r in queue.requests()) == [1, 3]
        assert drain(queue) == [1, 3]

    def test_requeued_request_replaces_its_old_entry(self) -> None:
        queue = RequestQueue()
        r = req(1)
        queue.push(r)
        r.version_tag = 4
        queue.push(r)
        assert len(queue) == 1 and drain(queue) == [1]


class TestMultiLevel:
    def test_versions_outrank_validation_and_drain_oldest_first(self) -> None:
        queue = RequestQueue(multi_level=True)
        for r in (req(1), req(2, 2, is_validate=True), req(3, 0), req(4, 1), req(5, 0)):
            queue.push(r)
        assert queue.level_sizes() == {UNVERSIONED: 1, 0: 2, 1: 1, 2: 1}
        assert drain(queue) == [3, 5, 4, 2, 1]

    def test_new_lower_level_jumps_ahead_of_higher_ones(self) -> None:
        queue = RequestQueue(multi_level=True)
        queue.push(req(1, 3))
        queue.push(req(2, 3))
        first = queue.pop()
        assert first is not None and first[0].request_id == 1
        queue.push(req(3, 1))
        assert drain(queue) == [3, 2]


@given(
    st.lists(
        st.tuples(st.integers(-1, 4), st.integers(1, 200), st.booleans()),
        min_size=1,
        max_size=60,
    ),
    st.booleans(),
)
def test_pop_order_matches_the_documented_priority(entries: list[tuple[int, int, bool]], multi_level: bool) -> None:
    queue = RequestQueue(multi_level=multi_level, sort_indicator="short_length")
    for rid, (version, tokens, is_validate) in enumerate(entries):
        queue.push(req(rid, version, tokens=tokens, is_validate=is_validate))
    rank = {**{v: v for v in range(5)}, UNVERSIONED: 99}

    def key(rid: int) -> tuple[int, ...]:
        version, tokens, is_validate = entries[rid]
        validation = 0 if is_validate else 1
        if multi_level:
            return (rank[version], validation, tokens, rid)
        return (validation, rank[version], tokens, rid)

    assert drain(queue) == sorted(range(len(entries)), key=key)
