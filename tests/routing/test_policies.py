"""Each routing policy's effect on placement."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from routing_helpers import COST, make_core, peek, request, route, snapshot

from psrl.routing import Reason, RouterCore


def place_many(core: RouterCore, count: int, start: int = 0) -> list[str | None]:
    return list(route(core, *[request(start + k) for k in range(count)]).values())


class TestRandom:
    def test_same_seed_same_choices_other_seed_other_choices(self) -> None:
        runs = [place_many(make_core("random", seed=seed), 40) for seed in (7, 7, 8)]
        assert runs[0] == runs[1]
        assert runs[0] != runs[2]

    def test_spreads_over_all_instances(self) -> None:
        counts = Counter(place_many(make_core("random", seed=3), 2000))
        assert set(counts) == {"i0", "i1", "i2", "i3"}
        assert min(counts.values()) > 400  # uniform would give 500 each

    def test_only_admitted_instances_are_drawn(self) -> None:
        core = make_core("random", seed=1)
        core.set_paused("i2", True)
        assert "i2" not in place_many(core, 200)


class TestRoundRobin:
    def test_cycles_in_instance_order(self) -> None:
        assert place_many(make_core("round_robin"), 6) == ["i0", "i1", "i2", "i3", "i0", "i1"]

    def test_skips_instances_that_cannot_take_the_request_and_keeps_the_turn(self) -> None:
        core = make_core("round_robin")
        core.set_paused("i1", True)
        assert place_many(core, 4) == ["i0", "i2", "i3", "i0"]
        core.set_paused("i1", False)
        assert place_many(core, 2, start=10) == ["i1", "i2"]


class TestRequestNumBalance:
    def test_goes_to_fewest_in_flight_with_ties_to_the_first(self) -> None:
        core = make_core()
        assert place_many(core, 4) == ["i0", "i1", "i2", "i3"]
        core.release(1)
        core.release(2)
        assert place_many(core, 2, start=10) == ["i1", "i2"]

    def test_keeps_loads_within_one(self) -> None:
        core = make_core()
        place_many(core, 103)
        for rid in range(0, 103, 3):
            core.release(rid)
        place_many(core, 50, start=1000)
        loads = [c.num_inflight for c in core.instances()]
        assert max(loads) - min(loads) <= 1


class TestThroughputOptimal:
    def test_prefers_the_instance_that_gains_most(self) -> None:
        core = make_core("throughput_optimal", versions=(0, 0), delta_throughput_threshold=0.0)
        # i0 runs 80 requests (compute-bound, past n* = 52), i1 runs 10 (weight-bound floor):
        # one more request adds a whole token per step on i1 but much less on i0.
        for rid in range(90):
            core.submit(request(rid, hint_instance="i0" if rid < 80 else "i1", force_pin_once=True))
        core.dispatch(0.0)
        i0, i1 = core.instance("i0"), core.instance("i1")
        assert (i0.num_inflight, i1.num_inflight) == (80, 10)
        decision = core.decide(request(500))
        assert decision.instance_id == "i1"
        assert decision.score == pytest.approx(COST.marginal_gain(10, i1.kv_tokens, 100))
        assert decision.score > COST.marginal_gain(80, i0.kv_tokens, 100)

    def test_no_gain_above_threshold_keeps_the_request_queued(self) -> None:
        core = make_core("throughput_optimal", versions=(0,), delta_throughput_threshold=0.5, capacity=10**9)
        placed = route(core, *[request(k) for k in range(400)])
        num_routed = sum(1 for v in placed.values() if v)
        # Past the kink (n* = 52) a request adds ~k3 / step < half a lone request's throughput.
        assert 40 < num_routed < 400
        result = core.dispatch(0.0)
        assert result.deferred[0].reason == Reason.NO_GAIN and core.num_queued == 400 - num_routed
        lenient = make_core("throughput_optimal", versions=(0,), delta_throughput_threshold=0.0, capacity=10**9)
        assert None not in route(lenient, *[request(k) for k in range(400)]).values()

    def test_falls_through_to_the_next_priority_group(self) -> None:
        core = make_core("throughput_optimal", versions=(1, 0), capacity=10**9)
        # The newest group (i0) is saturated beyond any gain; the older group (i1) still gains.
        for rid in range(300):
            core.submit(request(rid, version_tag=1, hint_instance="i0", force_pin_once=True))
        core.dispatch(0.0)
        assert 50 <= core.instance("i0").num_inflight < 300  # stops where the gain falls below threshold
        decision = core.decide(request(1000))
        assert (decision.instance_id, decision.priority_group, decision.version_tag) == ("i1", 1, 0)

    def test_skips_instances_without_kv_room_or_with_waiting_requests(self) -> None:
        core = make_core("throughput_optimal", versions=(0, 0, 0), admission_reject_on_waiting=False)
        core.apply_snapshot(snapshot("i0", 1, kv_tokens=99_950, kv_capacity_tokens=100_000))
        core.apply_snapshot(snapshot("i1", 1, num_waiting=2))
        assert route(core, request(1)) == {1: "i2"}


class TestThroughputOptimalWithBudget:
    def test_reserves_the_rest_of_the_current_page_for_the_response(self) -> None:
        core = make_core("throughput_optimal_with_budget", versions=(0,), request_budget=256)
        policy = core.policy
        assert policy.request_tokens(core.gather_inputs(request(1, num_response_tokens=0))) == 100 + 256  # type: ignore[attr-defined]
        assert policy.request_tokens(core.gather_inputs(request(2, num_response_tokens=300))) == 100 + 512  # type: ignore[attr-defined]

    def test_budgeted_load_changes_the_choice(self) -> None:
        # Same resident tokens, but i0's requests are budgeted to run much longer: only the
        # budget variant sees that and avoids it.
        for method, expected in (("throughput_optimal", "i0"), ("throughput_optimal_with_budget", "i1")):
            core = make_core(method, versions=(0, 0), capacity=200_000, request_budget=1024)
            core.apply_snapshot(
                snapshot("i0", 1, kv_tokens=40_000, budget_kv_tokens=190_000, kv_capacity_tokens=200_000)
            )
            core.apply_snapshot(
                snapshot("i1", 1, kv_tokens=40_000, budget_kv_tokens=60_000, kv_capacity_tokens=200_000)
            )
            assert route(core, request(1)) == {1: expected}, method


def prompt_tokens(prompt: int, length: int = 64, *, shared: Sequence[int] = ()) -> tuple[int, ...]:
    return tuple(shared) + tuple(1000 * prompt + k for k in range(length))


class TestCacheAware:
    def test_requests_sharing_a_prefix_follow_it(self) -> None:
        core = make_core("cache_aware")
        first = route(core, *[request(k, k, token_ids=prompt_tokens(k)) for k in range(4)])
        assert sorted(first.values()) == ["i0", "i1", "i2", "i3"]  # no match: smallest tree each time
        again = route(core, *[request(10 + k, k, token_ids=(*prompt_tokens(k), 7, 7)) for k in (2, 0, 3)])
        assert again == {12: "i2", 10: "i0", 13: "i3"}
        decision = core.decide(request(20, 1, token_ids=prompt_tokens(1)))
        assert (decision.instance_id, decision.detail) == ("i1", "cache_hit")

    def test_imbalance_switches_to_shortest_queue(self) -> None:
        core = make_core("cache_aware", versions=(0, 0), cache_aware_policy={"balance_abs_threshold": 4})
        hot = prompt_tokens(1)
        placed = route(core, *[request(k, 1, token_ids=hot) for k in range(8)])
        counts = Counter(placed.values())
        # Follows the prefix to i0 until i0 leads by more than 4 (and 1.5x); the balancing move
        # also gives i1 the prefix, and from then on equal matches go to the lower load.
        assert counts == {"i0": 5, "i1": 3}

    def test_kv_usage_trigger_and_overload_exclusion(self) -> None:
        core = make_core(
            "cache_aware",
            versions=(0, 0),
            cache_aware_policy={"balance_token_usage_threshold": 0.9, "overload_token_usage_threshold": 0.95},
        )
        route(core, request(1, token_ids=prompt_tokens(1)))  # i0 caches prompt 1
        core.apply_snapshot(snapshot("i0", 1, kv_tokens=96_000, kv_capacity_tokens=100_000, last_dispatch_seq=0))
        assert route(core, request(2, token_ids=prompt_tokens(1))) == {2: "i1"}  # overloaded: not admitted
        core.apply_snapshot(snapshot("i0", 2, kv_tokens=92_000, kv_capacity_tokens=100_000, last_dispatch_seq=1))
        decision = core.decide(request(3, token_ids=prompt_tokens(1)))
        assert decision.detail == "shortest_queue"

    def test_a_sync_clears_the_instances_prefixes(self) -> None:
        core = make_core("cache_aware", versions=(0, 0))
        route(core, request(1, token_ids=prompt_tokens(1)))
        assert core.decide(request(2, token_ids=prompt_tokens(1))).instance_id == "i0"
        core.set_version("i0", 1)
        core.release(1)
        core.release(2)
        decision = core.decide(request(3, token_ids=prompt_tokens(1)))
        assert decision.detail != "cache_hit"

    def test_tree_eviction_is_paced_by_the_event_clock_and_bounds_each_instance(self) -> None:
        core = make_core(
            "cache_aware", versions=(0,), cache_aware_policy={"max_tree_size": 200, "eviction_interval_secs": 60}
        )
        route(core, *[request(k, k, token_ids=prompt_tokens(k)) for k in range(10)], now=0.0)
        assert core.tree.tenant_tokens("i0") == 640  # evicted at t=0 before these were added
        route(core, request(50, 50, token_ids=prompt_tokens(50)), now=30.0)
        assert core.tree.tenant_tokens("i0") == 704  # within the interval: no eviction yet
        route(core, request(51, 51, token_ids=prompt_tokens(51)), now=61.0)
        assert core.tree.tenant_tokens("i0") == 192 + 64  # trimmed to <= 200, then request 51 added
        assert core.tree.match(prompt_tokens(51)) == {"i0": 64}  # the newest prefixes survive
        assert core.tree.match(prompt_tokens(0)) == {}

    def test_match_ratio_threshold(self) -> None:
        core = make_core("cache_aware", versions=(0, 0), cache_aware_policy={"cache_threshold": 0.5})
        shared = tuple(range(40))
        route(core, request(1, token_ids=prompt_tokens(1, 64, shared=shared)))  # i0 holds the shared 40
        weak = core.decide(request(2, token_ids=prompt_tokens(2, 64, shared=shared)))  # 40/104 < 0.5
        assert weak.detail == "smallest_tree" and weak.instance_id == "i1"
        strong = core.decide(request(3, token_ids=prompt_tokens(1, 64, shared=shared)))
        assert strong.detail == "cache_hit" and strong.instance_id == "i0"


class FixedTier:
    """An explicit offloaded-tier view: instance -> token prefixes it holds."""

    def __init__(self, held: dict[str, list[tuple[int, ...]]]) -> None:
        self.held = held

    def match(self, token_ids: Sequence[int]) -> dict[str, int]:
        tokens = tuple(token_ids)
        out = {}
        for instance, prefixes in self.held.items():
            best = max((len(p) for p in prefixes if tokens[: len(p)] == p), default=0)
            if best:
                out[instance] = best
        return out


class TestCacheAwareV1:
    def test_offloaded_hits_count_with_their_weight(self) -> None:
        tokens = prompt_tokens(3, 128)
        tier = FixedTier({"i2": [tokens[:96]]})
        weighted = make_core("cache_aware_v1", offload_tier=tier, cache_aware_policy={"lmcache_overlap_weight": 0.5})
        decision = weighted.decide(request(1, token_ids=tokens))
        assert (decision.instance_id, decision.detail, decision.score) == ("i2", "cache_hit", 0.5 * 96 // 16)
        ignored = make_core("cache_aware_v1", offload_tier=tier, cache_aware_policy={"lmcache_overlap_weight": 0.0})
        assert ignored.decide(request(1, token_ids=tokens)).detail == "least_load"

    def test_gpu_blocks_outweigh_offloaded_ones_at_lower_weight(self) -> None:
        tokens = prompt_tokens(4, 128)
        core = make_core("cache_aware_v1", versions=(0, 0, 0), cache_aware_policy={"lmcache_overlap_weight": 0.5})
        route(core, request(1, token_ids=tokens[:64]))  # i0 holds 4 GPU blocks
        core.offload_tier = FixedTier({"i1": [tokens[:112]]})  # i1 holds 7 offloaded blocks: 3.5 < 4
        assert peek(core, request(2, token_ids=tokens)) == ("i0", "cache_hit")
        core.offload_tier = FixedTier({"i1": [tokens]})  # 8 blocks x 0.5 = 4: tie, lower load wins
        assert peek(core, request(3, token_ids=tokens)) == ("i1", "cache_hit")
        core.offload_tier = FixedTier({"i0": [tokens]})  # offload beyond the GPU match adds 4 x 0.5
        assert peek(core, request(4, token_ids=tokens)) == ("i0", "cache_hit")

    def test_kv_capacity_gate(self) -> None:
        core = make_core("cache_aware_v1", versions=(0, 0), cache_aware_policy={"kv_capacity_threshold": 0.85})
        tokens = prompt_tokens(5, 64)
        route(core, request(1, token_ids=tokens))
        core.apply_snapshot(snapshot("i0", 1, kv_tokens=84_950, kv_capacity_tokens=100_000, last_dispatch_seq=0))
        assert core.decide(request(2, token_ids=tokens, num_prompt_tokens=64)).instance_id == "i1"


def test_unknown_method_and_missing_cost_model_are_refused() -> None:
    from psrl.config.coordination import RoutingStrategy
    from psrl.routing import make_policy

    with pytest.raises(ValueError, match="cost model"):
        make_policy(RoutingStrategy(method="throughput_optimal"))
