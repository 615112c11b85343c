"""Hand-built scenarios of the staleness ledger, each checked against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from psrl.config import load_config
from psrl.staleness import (
    AbortReason,
    BufferStatus,
    ChildRef,
    FinishVerdict,
    GroupState,
    LedgerError,
    LedgerSizes,
    ReserveRefusedError,
    StalenessLedger,
    check_invariants,
)


def make(
    eta: int, slots: int, *, ready: int | None = None, n: int = 1, n_red: int | None = None, start: int = 0
) -> StalenessLedger:
    sizes = LedgerSizes(eta, slots, ready if ready is not None else slots, n, n_red if n_red is not None else n)
    return StalenessLedger(sizes, next_buffer_id=start)


def complete(ledger: StalenessLedger, prompt_id: int, children: int = 1) -> None:
    for child in range(children):
        ledger.finish_child(prompt_id, child)


class TestReserve:
    def test_reserve_takes_latest_legal_buffer(self) -> None:
        ledger = make(eta=2, slots=1)
        assert ledger.reserve(1, 0, 0, "i0") == 2
        assert ledger.reserve(2, 0, 0, "i0") == 1
        assert ledger.reserve(3, 0, 0, "i0") == 0
        assert not ledger.can_reserve(4, 0)
        with pytest.raises(ReserveRefusedError):
            ledger.reserve(4, 0, 0, "i0")
        check_invariants(ledger)

    def test_indicator_values(self) -> None:
        ledger = make(eta=1, slots=1, n=2)
        assert ledger.reserve_indicator(7, 0) == -1.0
        ledger.reserve(7, 0, 0, "i0")
        assert ledger.reserve_indicator(7, 0) == -math.inf
        assert ledger.can_reserve_without_new_entry(7, 0)
        assert ledger.reserve_indicator(8, 0) == -0.0
        ledger.reserve(8, 0, 0, "i0")
        assert ledger.reserve_indicator(9, 0) == math.inf
        assert not ledger.can_reserve(9, 0)
        assert not ledger.can_reserve_without_new_entry(9, 0)

    def test_version_from_the_future_is_refused(self) -> None:
        ledger = make(eta=2, slots=4)
        assert not ledger.can_reserve(1, 1)
        assert ledger.reserve_indicator(1, 1) == math.inf
        assert not ledger.can_reserve(1, -1)

    def test_child_joins_only_inside_its_window(self) -> None:
        ledger = make(eta=1, slots=2, n=2, start=1)
        assert ledger.reserve(5, 0, 1, "a") == 2
        # A child at version 0 could only sit in buffer 1: the group's entry in buffer 2 is out of reach.
        assert not ledger.can_reserve(5, 0)
        assert ledger.reserve_indicator(5, 0) == math.inf
        with pytest.raises(ReserveRefusedError):
            ledger.reserve(5, 1, 0, "b")
        assert ledger.reserve(5, 1, 1, "b") == 2
        assert ledger.reserve(5, 1, 1, "b") == 2  # idempotent
        with pytest.raises(ReserveRefusedError):
            ledger.reserve(5, 1, 0, "b")  # same child, different version
        with pytest.raises(ReserveRefusedError):
            ledger.reserve(5, 2, 1, "b")  # child index outside 0..N'-1
        check_invariants(ledger)

    def test_older_child_lowers_group_version(self) -> None:
        ledger = make(eta=2, slots=2, n=2, start=1)
        assert ledger.reserve(5, 0, 1, "a") == 3
        assert not ledger.can_reserve(5, 0)  # 0 + 2 < 3
        ledger = make(eta=2, slots=2, n=2, start=1)
        ledger.reserve(1, 0, 1, "a")  # buffer 3
        ledger.reserve(2, 0, 1, "a")  # buffer 3 full of reservations
        assert ledger.reserve(5, 0, 1, "a") == 2
        assert ledger.reserve(5, 1, 0, "b") == 2
        assert ledger.group_version(5) == 0
        check_invariants(ledger)


class TestOccupy:
    def test_occupy_goes_to_earliest_buffer_with_room(self) -> None:
        ledger = make(eta=2, slots=2)
        assert ledger.reserve(1, 0, 0, "i") == 2
        complete(ledger, 1)
        outcome = ledger.occupy(1)
        assert outcome.buffer_id == 0
        assert outcome.move is None
        assert not outcome.is_buffer_ready
        assert ledger.buffer_counts(0).num_occupied == 1
        assert ledger.buffer_counts(2).num_reserved == 0
        check_invariants(ledger)

    def test_swap_moves_a_reservation_to_free_an_earlier_slot(self) -> None:
        ledger = make(eta=1, slots=1)
        assert ledger.reserve(1, 0, 0, "i") == 1
        assert ledger.reserve(2, 0, 0, "i") == 0
        assert ledger.buffer_counts(0).status == BufferStatus.STUCK
        complete(ledger, 1)
        outcome = ledger.occupy(1)
        assert outcome.buffer_id == 0
        assert outcome.is_buffer_ready
        assert outcome.move is not None
        assert (outcome.move.prompt_id, outcome.move.from_buffer, outcome.move.to_buffer) == (2, 0, 1)
        assert ledger.group_buffer(2) == 1
        check_invariants(ledger)

    def test_swap_refuses_reservation_whose_window_ends_early(self) -> None:
        ledger = make(eta=1, slots=1, start=1)
        assert ledger.reserve(1, 0, 0, "i") == 1  # version 0 may only use buffer 1
        assert ledger.reserve(2, 0, 1, "i") == 2
        complete(ledger, 2)
        outcome = ledger.occupy(2)
        assert outcome.move is None
        assert outcome.buffer_id == 2
        check_invariants(ledger)

    def test_group_completes_with_first_n_children(self) -> None:
        ledger = make(eta=0, slots=2, n=2, n_red=3)
        for child, instance in enumerate(("a", "b", "c")):
            ledger.reserve(9, child, 0, instance)
        assert ledger.finish_child(9, 2).verdict == FinishVerdict.ACCEPTED
        assert ledger.finish_child(9, 2).verdict == FinishVerdict.DUPLICATE
        outcome = ledger.finish_child(9, 0)
        assert outcome.verdict == FinishVerdict.GROUP_COMPLETE
        assert outcome.winners == (2, 0)
        assert outcome.surplus == (ChildRef(1, "b"),)
        assert ledger.finish_child(9, 1).verdict == FinishVerdict.LATE
        assert ledger.finish_child(10, 0).verdict == FinishVerdict.UNKNOWN
        assert not ledger.is_child_open(9, 1)
        assert ledger.group_state(9) == GroupState.COMPLETE
        check_invariants(ledger)

    def test_unrouted_children_are_surplus_too(self) -> None:
        ledger = make(eta=0, slots=1, n=1, n_red=3)
        ledger.reserve(4, 1, 0, "x")
        outcome = ledger.finish_child(4, 1)
        assert outcome.surplus == (ChildRef(0, None), ChildRef(2, None))

    def test_occupy_requires_a_complete_group(self) -> None:
        ledger = make(eta=0, slots=1, n=2)
        ledger.reserve(1, 0, 0, "i")
        with pytest.raises(LedgerError):
            ledger.occupy(1)
        with pytest.raises(LedgerError):
            ledger.occupy(99)


class TestAbort:
    def test_filled_window_kills_redundant_groups(self) -> None:
        ledger = make(eta=0, slots=2, ready=1)  # batch redundancy: 2 slots, ready at 1
        ledger.reserve(1, 0, 0, "i")
        ledger.reserve(2, 0, 0, "j")
        complete(ledger, 1)
        outcome = ledger.occupy(1)
        assert outcome.is_buffer_ready
        assert [(a.prompt_id, a.reason) for a in outcome.aborted] == [(2, AbortReason.STALE)]
        assert outcome.aborted[0].children_to_abort == (ChildRef(0, "j"),)
        assert ledger.closed_reason(2) == AbortReason.STALE
        assert ledger.is_version_dead(0)
        check_invariants(ledger)

    def test_child_abort_aborts_group_below_n(self) -> None:
        ledger = make(eta=0, slots=1, n=2, n_red=3)
        ledger.reserve(1, 0, 0, "a")
        ledger.reserve(1, 1, 0, "b")
        assert ledger.abort_child(1, 0) is None  # 2 children may still finish
        aborted = ledger.abort_child(1, 1)
        assert aborted is not None
        assert aborted.reason == AbortReason.FAILED
        assert aborted.children_to_abort == (ChildRef(2, None),)
        assert ledger.buffer_counts(0).num_reserved == 0
        assert ledger.abort_child(1, 2) is None  # already closed: idempotent
        assert not ledger.can_reserve(1, 0)
        check_invariants(ledger)

    def test_finished_child_cannot_be_aborted(self) -> None:
        ledger = make(eta=0, slots=1, n=2)
        ledger.reserve(1, 0, 0, "a")
        ledger.finish_child(1, 0)
        with pytest.raises(LedgerError):
            ledger.abort_child(1, 0)

    def test_filter_drops_complete_group_but_not_occupied_one(self) -> None:
        ledger = make(eta=0, slots=2)
        ledger.reserve(1, 0, 0, "a")
        ledger.reserve(2, 0, 0, "a")
        complete(ledger, 1)
        complete(ledger, 2)
        dropped = ledger.abort_group(1, AbortReason.FILTERED)
        assert dropped is not None and dropped.children_to_abort == ()
        ledger.occupy(2)
        with pytest.raises(LedgerError):
            ledger.abort_group(2, AbortReason.FILTERED)
        assert ledger.buffer_counts(0).num_empty == 1
        check_invariants(ledger)


class TestConsume:
    def test_consume_in_order_with_histogram(self) -> None:
        ledger = make(eta=1, slots=2, n=2)
        for prompt_id in (1, 2):
            for child in (0, 1):
                ledger.reserve(prompt_id, child, 0, "i")
            complete(ledger, prompt_id, 2)
            ledger.occupy(prompt_id)
        with pytest.raises(LedgerError):
            ledger.consume(1)
        consumed = ledger.consume(0)
        assert [g.prompt_id for g in consumed.groups] == [1, 2]
        assert consumed.groups[0].winner_versions == ((0, 0), (1, 0))
        assert consumed.staleness_histogram == {0: 4}
        assert consumed.num_bound_violations == 0
        assert ledger.next_buffer_id == 1
        with pytest.raises(LedgerError):
            ledger.consume(0)
        with pytest.raises(LedgerError):
            ledger.consume(1)  # not ready
        assert ledger.finish_child(1, 0).verdict == FinishVerdict.LATE
        check_invariants(ledger)

    def test_staleness_one_histogram(self) -> None:
        ledger = make(eta=1, slots=1, start=1)
        ledger.reserve(1, 0, 0, "i")  # buffer 1
        complete(ledger, 1)
        ledger.occupy(1)
        assert ledger.consume(1).staleness_histogram == {1: 1}

    def test_surplus_reservation_floats_after_consume(self) -> None:
        ledger = make(eta=1, slots=2, ready=1)
        assert ledger.reserve(1, 0, 0, "a") == 1
        assert ledger.reserve(2, 0, 0, "b") == 1
        assert ledger.reserve(3, 0, 0, "c") == 0
        assert ledger.reserve(4, 0, 0, "d") == 0
        complete(ledger, 3)
        assert ledger.occupy(3).buffer_id == 0
        ledger.consume(0)
        assert ledger.group_buffer(4) is None
        assert ledger.counts().num_floating == 1
        assert not ledger.can_reserve_without_new_entry(4, 0)
        check_invariants(ledger)
        complete(ledger, 4)
        outcome = ledger.occupy(4)  # lands in buffer 1, which fills: version 0 is dead
        assert outcome.buffer_id == 1 and outcome.is_buffer_ready
        assert sorted(a.prompt_id for a in outcome.aborted) == [1, 2]
        assert {a.reason for a in outcome.aborted} == {AbortReason.STALE}
        check_invariants(ledger)


class TestProactive:
    def _straggler_setup(self, n_red: int = 1) -> StalenessLedger:
        """Buffer 1 holds T (occupied) and straggler S; buffer 2 holds X (occupied) and Y (reserved)."""
        ledger = make(eta=1, slots=2, start=1, n=1, n_red=n_red)
        assert ledger.reserve(10, 0, 0, "s") == 1  # S
        assert ledger.reserve(11, 0, 0, "t") == 1  # T
        assert ledger.reserve(20, 0, 1, "x") == 2  # X
        assert ledger.reserve(21, 0, 1, "y") == 2  # Y
        complete(ledger, 11)
        assert ledger.occupy(11).buffer_id == 1
        complete(ledger, 20)
        assert ledger.occupy(20).buffer_id == 2  # S (version 0) cannot move to buffer 2
        return ledger

    def test_retry_moves_later_group_and_aborts_straggler(self) -> None:
        from psrl.staleness import apply_proactive_filter

        ledger = self._straggler_setup()
        assert apply_proactive_filter(ledger, "retry", 0) is None
        outcome = apply_proactive_filter(ledger, "retry", 1)
        assert outcome is not None and not hasattr(outcome, "groups")
        assert outcome.moved == (20,)
        assert [(a.prompt_id, a.reason) for a in outcome.aborted] == [(10, AbortReason.RETRY)]
        assert outcome.num_fresh_prompts == 1
        assert outcome.is_buffer_ready and ledger.is_ready(1)
        assert ledger.group_buffer(20) == 1
        check_invariants(ledger)
        assert ledger.consume(1).staleness_histogram == {1: 1, 0: 1}

    def test_retry_waits_without_enough_movable_groups(self) -> None:
        from psrl.staleness import proactive_retry

        ledger = make(eta=1, slots=2, start=1)
        ledger.reserve(10, 0, 0, "s")
        assert proactive_retry(ledger, 2) is None

    def test_truncate_force_completes_straggler(self) -> None:
        from psrl.staleness import TruncateOutcome, apply_proactive_filter

        ledger = self._straggler_setup(n_red=2)
        ledger.reserve(10, 1, 0, "s2")
        outcome = apply_proactive_filter(ledger, "truncate", 1)
        assert isinstance(outcome, TruncateOutcome)
        (group,) = outcome.groups
        assert group.prompt_id == 10
        assert group.winners == (0,)
        assert group.truncated == (ChildRef(0, "s"),)
        assert group.surplus == (ChildRef(1, "s2"),)
        assert outcome.occupancies[0].buffer_id == 1
        assert outcome.is_buffer_ready
        check_invariants(ledger)

    def test_truncate_needs_routed_children(self) -> None:
        from psrl.staleness import proactive_truncate

        ledger = make(eta=0, slots=2, n=2)
        ledger.reserve(1, 0, 0, "a")
        ledger.reserve(2, 0, 0, "a")
        ledger.reserve(2, 1, 0, "b")
        complete(ledger, 2, 2)
        ledger.occupy(2)
        assert proactive_truncate(ledger, 1) is None  # group 1 has only one routed child of N=2


def test_sizes_from_config() -> None:
    config = load_config(
        "demo",
        [
            "psrl.staleness_buffer_entries=8",
            "psrl.rollout_n=4",
            "psrl.rollout_coordination.redundant_rollout.enable=true",
            "psrl.rollout_coordination.redundant_rollout.redundant_global_batch_size=10",
            "psrl.rollout_coordination.redundant_rollout.redundant_rollout_n=5",
        ],
    )
    sizes = LedgerSizes.from_config(config)
    assert (sizes.staleness, sizes.num_slots, sizes.ready_entries) == (2, 10, 8)
    assert (sizes.alg_rollout_n, sizes.redundant_rollout_n) == (4, 5)


def test_sizes_are_validated() -> None:
    with pytest.raises(LedgerError):
        LedgerSizes(0, 1, 2, 1, 1)
    with pytest.raises(LedgerError):
        LedgerSizes(0, 2, 2, 3, 2)
    with pytest.raises(LedgerError):
        LedgerSizes(-1, 2, 2, 1, 1)
