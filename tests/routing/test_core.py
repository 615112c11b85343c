"""Router core state: status merging, loopbacks, failures, parking, determinism and replay."""

from __future__ import annotations

import msgspec
import pytest
from routing_helpers import WindowLedger, make_core, request, route, snapshot

from psrl.config.coordination import RoutingStrategy
from psrl.routing import (
    Reason,
    RouterCore,
    RoutingDecision,
    count_servable,
    make_policy,
    preempted_to_loop_back,
)
from psrl.routing.budget import budget_request_tokens, budget_response_tokens
from psrl.routing.replay import check_decisions
from psrl.routing.selector import SelectionSettings


class TestStatus:
    def test_tokens_routed_after_a_report_are_counted_until_a_report_includes_them(self) -> None:
        core = make_core(versions=(0,))
        route(core, request(1), request(2))  # dispatch seqs 0 and 1, 100 tokens each
        assert core.instance("i0").kv_tokens == 200
        core.apply_snapshot(snapshot("i0", 1, kv_tokens=130, last_dispatch_seq=0))  # engine saw request 1
        assert core.instance("i0").kv_tokens == 230  # 130 reported + 100 not yet seen
        core.apply_snapshot(snapshot("i0", 2, kv_tokens=260, last_dispatch_seq=1))
        assert core.instance("i0").kv_tokens == 260

    def test_routed_decisions_carry_consecutive_dispatch_sequence_numbers(self) -> None:
        core = make_core(versions=(0, 0))
        core.submit(request(9, version_tag=4))  # deferred: no sequence number
        for rid in (1, 2, 3):
            core.submit(request(rid))
        result = core.dispatch(0.0)
        assert [d.dispatch_seq for d in result.routed] == [0, 1, 2]
        assert [d.dispatch_seq for d in result.deferred] == [-1]
        assert core.next_dispatch_seq == 3

    def test_old_or_repeated_reports_and_unknown_instances_are_ignored(self) -> None:
        core = make_core(versions=(0,))
        assert core.apply_snapshot(snapshot("i0", 5, num_waiting=0))
        assert not core.apply_snapshot(snapshot("i0", 4, num_waiting=9))
        assert not core.apply_snapshot(snapshot("i0", 5, num_waiting=9))
        assert core.instance("i0").num_waiting == 0
        assert not core.apply_snapshot(snapshot("ghost", 1))


class TestRequestLifecycle:
    def test_loopback_keeps_the_version_and_charges_the_generated_tokens(self) -> None:
        ledger = WindowLedger(staleness=1)
        core = make_core(versions=(0, 0), ledger=ledger)
        route(core, request(1))
        core.set_version("i0", 1)
        looped = core.loop_back(1, num_response_tokens=300, token_ids=(1, 2, 3))
        assert (looped.version_tag, looped.hint_instance, looped.num_tokens) == (0, "i0", 400)
        (decision,) = core.dispatch(0.0).routed
        assert decision.version_tag == 0 and len(ledger.reserved) == 1  # no second reservation

    def test_dead_instance_hands_back_its_requests(self) -> None:
        core = make_core(versions=(0, 0))
        route(core, *[request(k) for k in range(4)])
        orphans = core.remove_instance("i1")
        assert sorted(r.request_id for r in orphans) == [1, 3]
        for r in orphans:
            core.submit(r)
        assert {d.instance_id for d in core.dispatch(0.0).routed} == {"i0"}

    def test_abort_removes_queued_parked_and_routed_requests(self) -> None:
        core = make_core(versions=(0,), max_concurrent_seqs_per_instance=1)
        route(core, request(1), request(2), request(3, version_tag=5))
        assert core.num_queued == 2
        assert core.abort(1) and core.abort(2) and core.abort(3)
        assert not core.abort(1)
        assert core.num_queued == 0 and core.instance("i0").num_inflight == 0


def test_a_ledger_refusal_keeps_the_request_waiting_with_the_reason() -> None:
    class RefusingLedger(WindowLedger):
        refuse = True

        def reserve(self, prompt_id: int, child: int, version: int, instance: str) -> int:
            if self.refuse:
                raise RuntimeError("window closed meanwhile")
            return super().reserve(prompt_id, child, version, instance)

    ledger = RefusingLedger()
    core = make_core(versions=(0,), ledger=ledger)
    core.submit(request(1))
    (refused,) = core.dispatch(0.0).deferred
    assert refused.reason == Reason.LEDGER_REFUSED and "window closed meanwhile" in refused.detail
    assert core.num_queued == 1 and core.instance("i0").num_inflight == 0
    ledger.refuse = False
    core.notify_ledger_changed()
    assert core.dispatch(0.0).routed[0].version_tag == 0


class TestParking:
    def test_parked_requests_are_retried_only_after_a_relevant_event(self) -> None:
        core = make_core(versions=(0,))
        core.submit(request(1, version_tag=3))
        assert [d.reason for d in core.dispatch(0.0).deferred] == [Reason.NO_ELIGIBLE_VERSION]
        route(core, request(2))  # unrelated routing does not wake it
        assert core.dispatch(0.0).deferred == []
        core.apply_snapshot(snapshot("i0", 1))  # a status report is not a version change either
        assert core.dispatch(0.0).deferred == []
        core.add_instance("i9", 3)
        assert core.dispatch(0.0).routed[0].instance_id == "i9"

    def test_a_full_instance_at_a_continuations_version_does_not_hold_up_other_work(self) -> None:
        core = make_core(versions=(0, 1), max_concurrent_seqs_per_instance=1)
        route(core, request(1, version_tag=1))  # fills i1, the only instance at version 1
        placed = route(core, request(2, version_tag=1), request(3))
        assert placed == {2: None, 3: "i0"}  # the continuation waits; the new request goes past it
        core.release(1)
        assert core.dispatch(0.0).routed[0].request_id == 2

    def test_a_request_that_any_instance_could_take_holds_the_line_when_all_are_full(self) -> None:
        core = make_core(versions=(0, 0), max_concurrent_seqs_per_instance=1)
        placed = route(core, request(1), request(2), request(3), request(4))
        assert list(placed.values()) == ["i0", "i1", None, None]
        assert [d.request_id for d in core.dispatch(0.0).deferred] == [3]  # 4 was not even tried

    def test_a_parked_request_keeps_its_place_in_line(self) -> None:
        core = make_core(versions=(0,), max_concurrent_seqs_per_instance=1)
        route(core, request(1))  # i0 full
        core.submit(request(2, hint_instance="i0", is_sticky=True))
        core.submit(request(3))
        core.dispatch(0.0)
        core.release(1)
        assert [d.request_id for d in core.dispatch(0.0).routed] == [2]

    def test_a_release_wakes_the_requests_parked_on_it_in_turn_not_all_at_once(self) -> None:
        core = make_core(versions=(0, 1), max_concurrent_seqs_per_instance=1)
        route(core, request(1, version_tag=1))  # fills i1, the only instance at version 1
        for request_id in range(2, 7):
            core.submit(request(request_id, version_tag=1))
        assert [d.request_id for d in core.dispatch(0.0).deferred] == [2, 3, 4, 5, 6]  # all parked on i1
        core.release(1)
        result = core.dispatch(0.0)
        assert [d.request_id for d in result.routed] == [2]  # the oldest takes the freed slot
        assert [d.request_id for d in result.deferred] == [3]  # the next finds i1 full: the turn ends
        core.release(2)
        assert [d.request_id for d in core.dispatch(0.0).routed] == [3]  # arrival order is kept

    def test_a_turn_passes_on_when_its_request_leaves(self) -> None:
        core = make_core(versions=(0, 1), max_concurrent_seqs_per_instance=1)
        route(core, request(1, version_tag=1))
        core.submit(request(2, version_tag=1))
        core.submit(request(3, version_tag=1))
        core.dispatch(0.0)
        core.release(1)  # wakes 2...
        core.abort(2)  # ...which is aborted before it is decided: 3 gets the turn
        assert [d.request_id for d in core.dispatch(0.0).routed] == [3]

    def test_a_new_group_refused_by_the_ledger_waits_for_room_not_for_every_change(self) -> None:
        ledger = WindowLedger(staleness=0, entries=1)
        core = make_core(versions=(0,), ledger=ledger)
        route(core, request(1))  # buffer 0's only entry
        core.submit(request(2))
        assert [d.reason for d in core.dispatch(0.0).deferred] == [Reason.NO_RESERVABLE]
        core.notify_ledger_changed()  # a change that frees nothing (an occupy, say)
        assert core.dispatch(0.0).deferred == []  # not re-decided
        ledger.counts[0] = 0  # the entry left buffer 0 without a notification...
        assert core.dispatch(0.0).routed[0].request_id == 2  # ...and the next pass still sees the room

    def test_a_new_group_is_woken_when_the_next_buffer_moves(self) -> None:
        ledger = WindowLedger(staleness=0, entries=1)
        core = make_core(versions=(0,), ledger=ledger)
        route(core, request(1))
        core.submit(request(2))
        assert [d.reason for d in core.dispatch(0.0).deferred] == [Reason.NO_RESERVABLE]
        assert core.dispatch(0.0).deferred == []
        ledger.first_buffer = 1  # buffer 0 consumed (version 0 still cannot place it: nothing routes,
        core.notify_ledger_changed()  # but the move wakes it and it is decided again)
        assert [d.request_id for d in core.dispatch(0.0).deferred] == [2]


def run_events(method: str, seed: int = 0) -> list[bytes]:
    """A fixed event sequence; returns the encoded decisions."""
    config = RoutingStrategy(method=method, seed=seed, enable_group_sticky=True, max_concurrent_seqs_per_instance=6)
    core = RouterCore(config, WindowLedger(staleness=1, entries=8), make_policy(config))
    for k in range(4):
        core.add_instance(f"i{k}", k % 2)
    encoded = []
    for step in range(60):
        core.submit(request(step, step // 3, child_index=step % 3, token_ids=(step // 3, 1, 2)))
        if step % 7 == 0:
            core.apply_snapshot(snapshot(f"i{step % 4}", step, num_waiting=step % 2, last_dispatch_seq=step))
        if step % 5 == 0 and step > 10:
            core.release(step - 10)
        if step == 30:
            core.set_version("i0", 2)
        result = core.dispatch(float(step))
        encoded += [msgspec.msgpack.encode(d) for d in (*result.routed, *result.deferred)]
    return encoded


@pytest.mark.parametrize("method", ["random", "round_robin", "request_num_balance", "cache_aware"])
def test_same_events_same_decisions(method: str) -> None:
    first = run_events(method)
    assert first == run_events(method)
    assert len(first) > 40


def test_recorded_decisions_replay_exactly_and_what_if_shows_changes() -> None:
    config = RoutingStrategy(method="request_num_balance")
    core = RouterCore(config, WindowLedger(), make_policy(config))
    for k in range(3):
        core.add_instance(f"i{k}", 0)
    decisions: list[RoutingDecision] = []
    for rid in range(30):
        core.submit(request(rid))
        if rid % 4 == 3:
            core.release(rid - 2)
        decisions += core.dispatch(0.0).routed
    wire = [msgspec.msgpack.decode(msgspec.msgpack.encode(d), type=RoutingDecision) for d in decisions]
    own = check_decisions(wire, SelectionSettings.from_config(config), core.policy)
    assert (own.num_checked, own.agreement) == (30, 1.0)
    other = RoutingStrategy(method="round_robin")
    what_if = check_decisions(wire, SelectionSettings.from_config(other), make_policy(other))
    assert 0 < len(what_if.mismatches) < 30


def test_servable_counts_per_version() -> None:
    ledger = WindowLedger(staleness=1, entries=1)
    ledger.groups[1] = 1  # prompt 1 holds an entry in buffer 1
    ledger.counts[1] = 1
    queued = [
        request(10, 1),  # sibling of prompt 1: joins at v >= 0
        request(11, 2),  # new group: buffer 0 (v=0) or 2 (v=1) have room
        request(12, 3, version_tag=1),  # continuation at version 1
        request(13, 4, version_tag=3),
    ]
    counts = count_servable(queued, ledger, [0, 1, 3])
    assert (counts[0].without_new_entry, counts[0].with_new_entry) == (1, 1)
    assert (counts[1].without_new_entry, counts[1].with_new_entry) == (2, 1)
    assert counts[3].total == 4


def test_core_reports_servable_work_including_parked_requests() -> None:
    core = make_core(versions=(0,), ledger=WindowLedger(staleness=0, entries=1))
    route(core, request(1), request(2), request(3, version_tag=2))
    counts = core.servable_counts([0, 2])
    assert counts[0].total == 0  # buffer 0 is full for new groups
    assert (counts[2].without_new_entry, counts[2].with_new_entry) == (1, 1)


def test_preemption_loopback_threshold() -> None:
    assert preempted_to_loop_back([4, 5], num_waiting=3, threshold=0) == (4, 5)
    assert preempted_to_loop_back([4, 5], num_waiting=3, threshold=1024) == ()
    assert preempted_to_loop_back([4], num_waiting=1025, threshold=1024) == (4,)
    with pytest.raises(ValueError, match="max_num_waiting"):
        preempted_to_loop_back([4], num_waiting=1, threshold=-1)


def test_budget_rounds_the_response_up_to_the_current_page() -> None:
    assert [budget_response_tokens(r, 1024) for r in (0, 1023, 1024, 2047, 2048)] == [1024, 1024, 2048, 2048, 3072]
    assert budget_request_tokens(100, 0, 512) == 612
    with pytest.raises(ValueError):
        budget_response_tokens(1, 0)
