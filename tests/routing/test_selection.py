"""Worker selection stages: each one's effect on where a request goes."""

from __future__ import annotations

import math

from routing_helpers import WindowLedger, make_core, request, route, snapshot

from psrl.routing import Reason, RoutingRequest


class TestVersionEligibility:
    def test_new_trajectory_takes_the_newest_version_and_is_pinned_to_it(self) -> None:
        ledger = WindowLedger(staleness=2)
        core = make_core(versions=(0, 2, 1), ledger=ledger)
        core.submit(request(1))
        (decision,) = core.dispatch(0.0).routed
        assert decision.instance_id == "i1" and decision.version_tag == 2
        assert ledger.reserved == [(1, 0, 2, "i1")]
        assert decision.reserved_buffer == 4  # latest legal buffer: worst-case placement

    def test_continuation_goes_to_the_oldest_acceptable_version_without_a_new_reservation(self) -> None:
        ledger = WindowLedger(staleness=2)
        core = make_core(versions=(0, 3, 1), ledger=ledger)
        placed = route(core, request(1, version_tag=1))
        assert placed == {1: "i2"}
        assert ledger.reserved == []  # it already holds its slot

    def test_no_instance_at_the_trajectory_version_keeps_it_queued_until_one_syncs(self) -> None:
        core = make_core(versions=(0, 1))
        result = core.dispatch(0.0)
        core.submit(request(1, version_tag=2))
        result = core.dispatch(0.0)
        assert result.deferred[0].reason == Reason.NO_ELIGIBLE_VERSION
        assert core.num_queued == 1
        core.set_version("i0", 2)
        (decision,) = core.dispatch(0.0).routed
        assert decision.instance_id == "i0"

    def test_unhealthy_instances_are_not_candidates(self) -> None:
        core = make_core(versions=(0, 0))
        core.set_healthy("i0", False)
        assert route(core, request(1), request(2)) == {1: "i1", 2: "i1"}


class TestReservation:
    def test_versions_the_ledger_cannot_place_are_skipped(self) -> None:
        ledger = WindowLedger(staleness=0, first_buffer=1)  # version 0 can no longer land
        core = make_core(versions=(0, 1), ledger=ledger)
        assert route(core, request(1)) == {1: "i1"}

    def test_unplaceable_request_waits_for_the_ledger_then_routes(self) -> None:
        ledger = WindowLedger(staleness=0, entries=1)
        core = make_core(versions=(0,), ledger=ledger)
        assert route(core, request(1), request(2)) == {1: "i0", 2: None}
        core.dispatch(0.0)
        assert core.num_queued == 1
        ledger.first_buffer = 1  # buffer 0 consumed ...
        core.set_version("i0", 1)  # ... and the instance synced
        ledger.counts.clear()
        core.notify_ledger_changed()
        (decision,) = core.dispatch(0.0).routed
        assert (decision.request_id, decision.version_tag) == (2, 1)

    def test_sibling_waiting_on_its_group_routes_once_the_group_reserves(self) -> None:
        ledger = WindowLedger(staleness=0, entries=1)
        core = make_core(versions=(0, 0), ledger=ledger)
        ledger.counts[0] = 1  # buffer 0 full: only joining an existing entry is possible
        ledger.groups[7] = 0  # prompt 7 already holds an entry
        assert route(core, request(1, 7, child_index=1), request(2, 8)) == {1: "i0", 2: None}

    def test_reserve_capability_orders_instances_by_the_ledgers_indicator(self) -> None:
        indicators = {2: -3.0, 0: -math.inf}  # version 0 joins an existing entry, version 2 opens one

        class IndicatorLedger(WindowLedger):
            def reserve_indicator(self, prompt_id: int, version: int) -> float:
                return indicators[version]

        by_version = make_core(versions=(2, 0), ledger=IndicatorLedger())
        assert route(by_version, request(1, 5)) == {1: "i0"}  # newest version first
        by_indicator = make_core(
            versions=(2, 0), ledger=IndicatorLedger(), candidate_sort_indicator="reserve_capability"
        )
        assert route(by_indicator, request(1, 5)) == {1: "i1"}
        decision = by_indicator.dispatch(0.0)
        assert decision.routed == []


class TestPins:
    def test_sticky_loopback_returns_to_its_instance(self) -> None:
        core = make_core(versions=(0, 0))
        assert route(core, request(1, is_sticky=True)) == {1: "i0"}
        core.loop_back(1, num_response_tokens=40)
        for rid in (2, 3, 4):
            route(core, request(rid))  # load the other instance less than i0
        core.dispatch(0.0)
        assert core.routed_instance(1) == "i0"

    def test_free_loopback_routes_by_policy_and_names_the_kv_source(self) -> None:
        core = make_core(versions=(0, 0))
        route(core, request(1), request(2))  # i0 and i1 each hold one
        route(core, request(3))  # i0 holds two
        core.loop_back(3, num_response_tokens=40)
        core.release(2)  # i1 now empty
        (decision,) = core.dispatch(0.0).routed
        assert decision.instance_id == "i1" and decision.moved_from == "i0"
        assert decision.pinned_by == ""

    def test_force_pin_applies_once(self) -> None:
        core = make_core(versions=(0, 0))
        route(core, request(9))  # i0 busier
        r = request(1, hint_instance="i0", force_pin_once=True)
        assert route(core, r) == {1: "i0"}
        assert r.force_pin_once is False
        core.loop_back(1, num_response_tokens=10)
        core.dispatch(0.0)
        assert core.routed_instance(1) == "i1"  # the pin was spent

    def test_pinned_request_waits_for_its_busy_instance(self) -> None:
        core = make_core(versions=(0, 0), max_concurrent_seqs_per_instance=1)
        route(core, request(1))  # fills i0
        result_before = route(core, request(2, hint_instance="i0", is_sticky=True))
        assert result_before == {2: None}
        assert core.dispatch(0.0).deferred == []  # parked: not retried without a change
        core.release(1)
        (decision,) = core.dispatch(0.0).routed
        assert (decision.request_id, decision.instance_id, decision.pinned_by) == (2, "i0", "hint")

    def test_pin_to_a_dead_instance_falls_through(self) -> None:
        core = make_core(versions=(0, 0))
        core.remove_instance("i0")
        assert route(core, request(1, hint_instance="i0", is_sticky=True)) == {1: "i1"}

    def test_group_sticky_keeps_a_prompts_children_together_until_all_leave(self) -> None:
        core = make_core(versions=(0, 0, 0), enable_group_sticky=True)
        placed = route(core, *[request(k, 1, child_index=k) for k in range(4)])
        assert set(placed.values()) == {"i0"}
        assert route(core, request(10, 2), request(11, 3)) == {10: "i1", 11: "i2"}  # other prompts balance
        assert route(core, request(4, 1, child_index=4)) == {4: "i0"}  # pinned although i0 is busiest
        for k in range(5):
            core.release(k)
        route(core, request(30, 9), request(31, 9))  # i0 becomes the busiest again
        assert route(core, request(20, 1, child_index=5)) == {20: "i1"}  # the pin left with the group


class TestAdmission:
    def test_in_flight_cap(self) -> None:
        core = make_core(versions=(0, 0), max_concurrent_seqs_per_instance=2)
        placed = route(core, *[request(k) for k in range(5)])
        assert sorted(v for v in placed.values() if v) == ["i0", "i0", "i1", "i1"]
        assert placed[4] is None
        core.release(0)
        assert core.dispatch(0.0).routed[0].instance_id == "i0"

    def test_zero_cap_means_no_cap(self) -> None:
        core = make_core(versions=(0,), max_concurrent_seqs_per_instance=0)
        assert None not in route(core, *[request(k) for k in range(50)]).values()

    def test_engine_waiting_queue_refuses_new_work_when_enabled(self) -> None:
        core = make_core(versions=(0, 0))
        core.apply_snapshot(snapshot("i0", 1, num_waiting=3))
        assert set(route(core, request(1), request(2), request(3)).values()) == {"i1"}
        relaxed = make_core(versions=(0, 0), admission_reject_on_waiting=False)
        relaxed.apply_snapshot(snapshot("i0", 1, num_waiting=3))
        assert set(route(relaxed, request(1), request(2)).values()) == {"i0", "i1"}

    def test_paused_instance_admits_nothing_and_resuming_releases_its_pinned_work(self) -> None:
        core = make_core(versions=(0, 0))
        core.set_paused("i0", True)
        assert route(core, request(1), request(2, hint_instance="i0", is_sticky=True)) == {1: "i1", 2: None}
        core.set_paused("i0", False)
        assert core.dispatch(0.0).routed[0].instance_id == "i0"

    def test_full_cluster_stops_the_pass_at_the_head(self) -> None:
        core = make_core(versions=(0,), max_concurrent_seqs_per_instance=1)
        result = route(core, *[request(k) for k in range(20)])
        assert list(result.values()).count("i0") == 1
        again = core.dispatch(0.0)
        assert len(again.deferred) == 1 and again.deferred[0].reason == Reason.NOT_ADMITTED

    def test_paused_router_decides_nothing(self) -> None:
        core = make_core(versions=(0,))
        core.pause()
        assert route(core, request(1)) == {1: None}
        core.resume()
        assert core.dispatch(0.0).routed[0].request_id == 1


def test_requests_cannot_be_resubmitted_while_routed() -> None:
    core = make_core(versions=(0,))
    r: RoutingRequest = request(1)
    route(core, r)
    try:
        core.submit(r)
    except ValueError as exc:
        assert "still routed" in str(exc)
    else:
        raise AssertionError("resubmitting a routed request must fail")
