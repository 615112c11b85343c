"""Property tests: random event sequences against the ledger's invariants.

A reference model outside the ledger records every group's fate from the outcome records alone
(reserved, consumed once, or aborted once with a reason). After every step the ledger's own
recount (`check_invariants`) must pass and the model must agree with the ledger's view.
Run for staleness 0..4, with redundancy (batch- and group-level) on and off.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from psrl.staleness import (
    AbortReason,
    FinishVerdict,
    GroupAborted,
    GroupState,
    LedgerSizes,
    ReserveRefusedError,
    RetryOutcome,
    StalenessLedger,
    apply_proactive_filter,
    check_invariants,
)

INSTANCES = ("i0", "i1", "i2")


class LedgerMachine(RuleBasedStateMachine):
    sizes: LedgerSizes

    def __init__(self) -> None:
        super().__init__()
        self.ledger = StalenessLedger(self.sizes)
        self.eta = self.sizes.staleness
        self.next_prompt = 0
        self.reserved_prompts: set[int] = set()
        self.child_version: dict[tuple[int, int], int] = {}
        self.consumed: dict[int, int] = {}  # prompt -> buffer it was consumed from
        self.aborted: dict[int, AbortReason] = {}
        self.is_redundant = self.sizes.num_slots > self.sizes.ready_entries
        self.is_group_redundant = self.sizes.redundant_rollout_n > self.sizes.alg_rollout_n

    # ------------------------------------------------------------ outcome bookkeeping

    def record_aborted(self, outcomes: tuple[GroupAborted, ...] | list[GroupAborted]) -> None:
        for outcome in outcomes:
            prompt_id = outcome.prompt_id
            assert prompt_id in self.reserved_prompts
            assert prompt_id not in self.aborted, f"group {prompt_id} aborted twice"
            assert prompt_id not in self.consumed, f"group {prompt_id} aborted after being consumed"
            assert self.ledger.group_state(prompt_id) is None
            self.aborted[prompt_id] = outcome.reason
            event(f"abort {outcome.reason.name}")

    def live(self, state: GroupState | None = None) -> list[int]:
        return sorted(
            p
            for p in self.reserved_prompts
            if (s := self.ledger.group_state(p)) is not None and (state is None or s == state)
        )

    # ------------------------------------------------------------ rules

    @rule(data=st.data())
    def reserve(self, data: st.DataObject) -> None:
        next_buffer = self.ledger.next_buffer_id
        version = data.draw(st.integers(max(0, next_buffer - self.eta - 1), next_buffer + 1), label="version")
        candidates = self.live(GroupState.IN_FLIGHT)
        is_new = not candidates or data.draw(st.booleans(), label="new prompt")
        prompt_id = self.next_prompt if is_new else data.draw(st.sampled_from(candidates), label="prompt")
        child = data.draw(st.integers(0, self.sizes.redundant_rollout_n - 1), label="child")
        can = self.ledger.can_reserve(prompt_id, version)
        indicator = self.ledger.reserve_indicator(prompt_id, version)
        assert can == (indicator != math.inf)
        assert self.ledger.can_reserve_without_new_entry(prompt_id, version) == (indicator == -math.inf)
        if version > next_buffer:
            assert not can
        is_fresh_child = (prompt_id, child) not in self.child_version and self.ledger.is_child_open(prompt_id, child)
        try:
            buffer_id = self.ledger.reserve(prompt_id, child, version, data.draw(st.sampled_from(INSTANCES)))
        except ReserveRefusedError:
            assert not (can and is_fresh_child), "reserve refused what can_reserve allowed"
            return
        assert can
        assert version <= buffer_id <= version + self.eta
        if indicator != -math.inf:
            assert buffer_id == -indicator
        self.child_version[(prompt_id, child)] = version
        self.reserved_prompts.add(prompt_id)
        if is_new:
            self.next_prompt += 1

    @rule(data=st.data())
    def dispatch_group(self, data: st.DataObject) -> None:
        """The common path: a new prompt whose children are all routed, at a recent version each."""
        prompt_id = self.next_prompt
        next_buffer = self.ledger.next_buffer_id
        for child in range(self.sizes.redundant_rollout_n):
            version = data.draw(st.integers(max(0, next_buffer - self.eta), next_buffer), label="version")
            if not self.ledger.can_reserve(prompt_id, version):
                continue
            buffer_id = self.ledger.reserve(prompt_id, child, version, INSTANCES[child % len(INSTANCES)])
            assert version <= buffer_id <= version + self.eta
            self.child_version[(prompt_id, child)] = version
            self.reserved_prompts.add(prompt_id)
        self.next_prompt += prompt_id in self.reserved_prompts

    def running_children(self) -> list[tuple[int, int]]:
        return sorted(
            (p, c)
            for (p, c) in self.child_version
            if self.ledger.group_state(p) == GroupState.IN_FLIGHT and self.ledger.is_child_open(p, c)
        )

    @precondition(lambda self: self.running_children())
    @rule(data=st.data())
    def finish_running(self, data: st.DataObject) -> None:
        prompt_id, child = data.draw(st.sampled_from(self.running_children()))
        self.finish_checked(prompt_id, child)

    @precondition(lambda self: self.live(GroupState.IN_FLIGHT))
    @rule(method=st.sampled_from(["retry", "truncate"]), threshold=st.integers(1, 3))
    def complete_newest(self, method: str, threshold: int) -> None:
        """Newer groups overtaking older ones: what leaves stragglers behind in early buffers."""
        prompt_id = self.live(GroupState.IN_FLIGHT)[-1]
        for child in sorted(c for (p, c) in self.child_version if p == prompt_id):
            if self.ledger.group_state(prompt_id) == GroupState.IN_FLIGHT and self.ledger.is_child_open(
                prompt_id, child
            ):
                self.finish_checked(prompt_id, child)
        if self.ledger.group_state(prompt_id) == GroupState.COMPLETE:
            outcome = self.ledger.occupy(prompt_id)
            if outcome.buffer_id is None:
                assert self.is_redundant, "a group lost its slot without batch redundancy"
                event("no room")
            self.record_aborted(outcome.aborted)
        self.proactive(method, threshold)  # the owner runs the filter after every event touching a buffer

    @precondition(lambda self: self.live(GroupState.IN_FLIGHT))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        prompt_id = data.draw(st.sampled_from(self.live(GroupState.IN_FLIGHT)))
        routed = sorted(c for (p, c) in self.child_version if p == prompt_id)
        self.finish_checked(prompt_id, data.draw(st.sampled_from(routed)))

    def finish_checked(self, prompt_id: int, child: int) -> None:
        before_open = self.ledger.is_child_open(prompt_id, child)
        outcome = self.ledger.finish_child(prompt_id, child)
        if not before_open:
            assert outcome.verdict in (FinishVerdict.DUPLICATE, FinishVerdict.LATE)
            return
        assert outcome.verdict in (FinishVerdict.ACCEPTED, FinishVerdict.GROUP_COMPLETE)
        if outcome.verdict == FinishVerdict.GROUP_COMPLETE:
            assert len(outcome.winners) == self.sizes.alg_rollout_n
            assert len(set(outcome.winners)) == len(outcome.winners)
            assert not {ref.child for ref in outcome.surplus} & set(outcome.winners)
            assert self.ledger.group_state(prompt_id) == GroupState.COMPLETE

    @precondition(lambda self: self.live(GroupState.COMPLETE))
    @rule(data=st.data())
    def occupy(self, data: st.DataObject) -> None:
        prompt_id = data.draw(st.sampled_from(self.live(GroupState.COMPLETE)))
        reserved_buffer = self.ledger.group_buffer(prompt_id)
        outcome = self.ledger.occupy(prompt_id)
        if outcome.buffer_id is None:
            assert self.is_redundant, "a group lost its slot without batch redundancy"
        else:
            if reserved_buffer is not None and not self.is_redundant:
                assert outcome.buffer_id <= reserved_buffer, "occupied later than its reservation"
            assert self.ledger.group_state(prompt_id) == GroupState.OCCUPIED
        if outcome.move is not None:
            event("swap" if outcome.move.to_buffer is not None else "displace")
            assert outcome.move.to_buffer is not None or self.is_redundant
        self.record_aborted(outcome.aborted)

    @precondition(lambda self: self.live(GroupState.IN_FLIGHT))
    @rule(data=st.data())
    def abort_child(self, data: st.DataObject) -> None:
        if data.draw(st.integers(0, 3), label="rarely") != 0:
            return
        prompt_id = data.draw(st.sampled_from(self.live(GroupState.IN_FLIGHT)))
        child = data.draw(st.integers(0, self.sizes.redundant_rollout_n - 1))
        if not self.ledger.is_child_open(prompt_id, child):
            return
        outcome = self.ledger.abort_child(prompt_id, child, AbortReason.FAILED)
        if outcome is not None:
            self.record_aborted([outcome])

    @precondition(lambda self: self.live(GroupState.COMPLETE) or self.live(GroupState.IN_FLIGHT))
    @rule(data=st.data())
    def filter_group(self, data: st.DataObject) -> None:
        if data.draw(st.integers(0, 3), label="rarely") != 0:
            return
        prompt_id = data.draw(st.sampled_from(self.live(GroupState.COMPLETE) + self.live(GroupState.IN_FLIGHT)))
        outcome = self.ledger.abort_group(prompt_id, AbortReason.FILTERED)
        assert outcome is not None
        self.record_aborted([outcome])

    @precondition(lambda self: self.ledger.is_ready(self.ledger.next_buffer_id))
    @rule()
    def consume(self) -> None:
        buffer_id = self.ledger.next_buffer_id
        consumed = self.ledger.consume(buffer_id)
        event(f"consume, staleness {max(consumed.staleness_histogram)}")
        assert len(consumed.groups) == self.sizes.ready_entries
        assert consumed.num_bound_violations == 0
        for group in consumed.groups:
            assert group.prompt_id not in self.consumed, f"group {group.prompt_id} consumed twice"
            assert group.prompt_id not in self.aborted
            self.consumed[group.prompt_id] = buffer_id
            assert len(group.winner_versions) == self.sizes.alg_rollout_n
            for child, version in group.winner_versions:
                assert self.child_version[(group.prompt_id, child)] == version
                assert version <= buffer_id <= version + self.eta, "staleness bound violated"
                if self.eta == 0:
                    assert version == buffer_id, "staleness 0 must be synchronous"
        assert sum(consumed.staleness_histogram.values()) == self.sizes.ready_entries * self.sizes.alg_rollout_n
        assert all(0 <= s <= self.eta for s in consumed.staleness_histogram)

    @rule(method=st.sampled_from(["retry", "truncate"]), threshold=st.integers(0, 3))
    def proactive(self, method: str, threshold: int) -> None:
        buffer_id = self.ledger.next_buffer_id
        reserved = self.ledger.reserved_groups(buffer_id)
        num_complete = sum(1 for p in reserved if self.ledger.group_state(p) == GroupState.COMPLETE)
        outcome = apply_proactive_filter(self.ledger, method, threshold)  # type: ignore[arg-type]
        if outcome is None:
            return
        assert outcome.buffer_id == buffer_id
        event(f"proactive {method}")
        # Complete groups reserved in the buffer are about to occupy it; the filter leaves them room.
        assert outcome.is_buffer_ready == (num_complete == 0)
        if isinstance(outcome, RetryOutcome):
            self.record_aborted(outcome.aborted)
            assert outcome.num_fresh_prompts == sum(1 for a in outcome.aborted if a.reason == AbortReason.RETRY)
        else:
            for occupancy in outcome.occupancies:
                assert occupancy.buffer_id == outcome.buffer_id
                self.record_aborted(occupancy.aborted)

    # ------------------------------------------------------------ invariants

    @invariant()
    def ledger_recount_agrees(self) -> None:
        check_invariants(self.ledger)
        assert self.ledger.num_bound_violations == 0

    @invariant()
    def every_group_accounted_once(self) -> None:
        live = set(self.live())
        consumed, aborted = set(self.consumed), set(self.aborted)
        assert live | consumed | aborted == self.reserved_prompts, "a reserved group was lost"
        assert not (live & consumed or live & aborted or consumed & aborted), "a group is counted twice"

    def teardown(self) -> None:
        """Drain: finish every routed child, occupy, consume; nothing may remain in flight unaccounted."""
        for _ in range(64):
            for prompt_id in self.live(GroupState.IN_FLIGHT):
                for child in sorted(c for (p, c) in self.child_version if p == prompt_id):
                    if self.ledger.is_child_open(prompt_id, child):
                        self.ledger.finish_child(prompt_id, child)
            for prompt_id in self.live(GroupState.COMPLETE):
                if self.ledger.group_state(prompt_id) == GroupState.COMPLETE:  # an occupy may abort the next
                    self.record_aborted(self.ledger.occupy(prompt_id).aborted)
            if self.ledger.is_ready(self.ledger.next_buffer_id):
                self.consume()
            else:
                break
        for prompt_id in self.live(GroupState.IN_FLIGHT):  # groups missing unrouted children
            outcome = self.ledger.abort_group(prompt_id, AbortReason.CANCELLED)
            assert outcome is not None
            self.record_aborted([outcome])
        check_invariants(self.ledger)
        self.every_group_accounted_once()
        assert all(self.ledger.group_state(p) == GroupState.OCCUPIED for p in self.live())


def machine_for(sizes: LedgerSizes) -> type[LedgerMachine]:
    return type(f"Ledger_{sizes.staleness}", (LedgerMachine,), {"sizes": sizes})


@pytest.mark.parametrize("is_redundant", [False, True], ids=["plain", "redundant"])
@pytest.mark.parametrize("eta", [0, 1, 2, 3, 4])
def test_ledger_invariants_hold_under_random_events(eta: int, is_redundant: bool) -> None:
    sizes = LedgerSizes(
        staleness=eta,
        num_slots=4 if is_redundant else 3,
        ready_entries=3,
        alg_rollout_n=2,
        redundant_rollout_n=3 if is_redundant else 2,
    )
    run_state_machine_as_test(
        machine_for(sizes),
        settings=settings(
            max_examples=60,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


@pytest.mark.parametrize("eta", [0, 2])
def test_single_child_groups(eta: int) -> None:
    sizes = LedgerSizes(staleness=eta, num_slots=2, ready_entries=2, alg_rollout_n=1, redundant_rollout_n=1)
    run_state_machine_as_test(
        machine_for(sizes),
        settings=settings(max_examples=40, stateful_step_count=50, deadline=None),
    )
