"""Sync strategies: which instances pull new weights on a tick, and why."""

from __future__ import annotations

import pytest
from coordination_helpers import COST, inputs, inst, strategy

from psrl.coordination.sync import SyncPolicy


def greedy(partial: bool = True) -> SyncPolicy:
    return SyncPolicy(strategy("greedy"), partial_rollout=partial)


def status(indicator: str = "request_num", threshold: float | None = 2, **sync: object) -> SyncPolicy:
    return SyncPolicy(strategy(sync={"indicator": indicator, "threshold": threshold, **sync}), partial_rollout=True)


class TestScreening:
    def test_greedy_syncs_every_lagging_instance(self) -> None:
        decision = greedy().decide(inputs(2, inst("a", 1, running=40), inst("b", 2), inst("c", 0, report=False)))
        assert decision.instance_ids == ("a", "c")
        assert decision.reasons["b"] == "up_to_date"

    def test_instances_mid_sync_or_with_pre_sync_reports_are_left_alone(self) -> None:
        decision = greedy().decide(
            inputs(3, inst("a", 1, is_syncing=True), inst("b", 2, report_version=1, stale_report_version=1))
        )
        assert decision.instance_ids == ()
        assert decision.reasons == {"a": "syncing", "b": "stale_report"}

    def test_without_partial_rollout_only_idle_instances_sync(self) -> None:
        decision = greedy(partial=False).decide(inputs(1, inst("a", 0, running=3), inst("b", 0)))
        assert decision.instance_ids == ("b",)
        assert decision.reasons["a"] == "busy_without_partial_rollout"

    def test_warmup_guard_holds_until_the_next_buffer_is_ready(self) -> None:
        policy = SyncPolicy(strategy("greedy", sync={"seamless_train_version": 1}), partial_rollout=True)
        held = policy.decide(inputs(1, inst("a", 0)))
        assert held.instance_ids == () and held.reasons["a"] == "warmup_hold"
        assert policy.decide(inputs(1, inst("a", 0), ready_buffers=frozenset({1}))).instance_ids == ("a",)
        assert policy.decide(inputs(2, inst("a", 0))).instance_ids == ("a",)  # past the guard


class TestStatusBased:
    def test_request_num_syncs_at_or_below_the_threshold(self) -> None:
        decision = status().decide(inputs(1, inst("a", 0, running=2), inst("b", 0, running=3)))
        assert decision.instance_ids == ("a",)
        assert decision.reasons["b"] == "above_threshold"

    @pytest.mark.parametrize(
        ("indicator", "threshold", "low", "high"),
        [
            ("throughput", 100.0, {"throughput": 80.0}, {"throughput": 500.0}),
            ("kv_cache", 0.3, {"kv_usage": 0.25}, {"kv_usage": 0.9}),
        ],
    )
    def test_other_indicators(self, indicator: str, threshold: float, low: dict, high: dict) -> None:
        decision = status(indicator, threshold).decide(inputs(1, inst("a", 0, **low), inst("b", 0, **high)))
        assert decision.instance_ids == ("a",)

    def test_waiting_engine_queue_postpones(self) -> None:
        decision = status().decide(inputs(1, inst("a", 0, waiting=1)))
        assert decision.reasons["a"] == "engine_waiting"

    def test_queued_work_for_the_current_version_postpones_unless_disabled(self) -> None:
        tick = inputs(1, inst("a", 0), inst("b", 1, report_version=1), servable={0: (3, 0)})
        assert status().decide(tick).reasons["a"] == "queued_work_at_current_version"
        assert status(check_req_before_sync=False).decide(tick).instance_ids == ("a",)
        # new-entry work does not postpone: it can as well start on the new version
        assert status().decide(inputs(1, inst("a", 0), servable={0: (0, 5)})).instance_ids == ("a",)

    def test_router_mid_selection_postpones(self) -> None:
        from psrl.coordination.state import RouterFacts

        tick = inputs(1, inst("a", 0))
        busy = type(tick)(tick.now, tick.ps_version, tick.instances, RouterFacts(is_selecting=True))
        assert status().decide(busy).reasons["a"] == "router_selecting"

    def test_without_partial_rollout_the_instance_must_be_idle(self) -> None:
        policy = SyncPolicy(strategy(sync={"threshold": 5}), partial_rollout=False)
        decision = policy.decide(inputs(1, inst("a", 0, running=1), inst("b", 0)))
        assert decision.instance_ids == ("b",)


class TestHypothesisTest:
    """Constructed cases; COST has its kink at 52 requests, prompts 200 and responses 1000 tokens."""

    def policy(self, threshold: float | None = None) -> SyncPolicy:
        settings = strategy(sync={"indicator": "hypothesis_test", "threshold": threshold, "hypothesis_pull_s": 2.0})
        return SyncPolicy(settings, partial_rollout=True, cost_model=COST, max_concurrent_seqs=256)

    def tick(self, instance, servable, horizon: float = 30.0):  # type: ignore[no-untyped-def]
        return inputs(
            1,
            instance,
            servable=servable,
            mean_version_interval_s=horizon,
            mean_prompt_tokens=200,
            mean_response_tokens=1000,
        )

    def test_old_version_without_work_while_the_new_one_has_plenty_syncs(self) -> None:
        early = inst("a", 0, running=30, kv_tokens=30 * 300, response_tokens=30 * 100)
        decision = self.policy().decide(self.tick(early, {0: (0, 0), 1: (0, 200)}))
        assert decision.instance_ids == ("a",) and decision.reasons["a"] == "benefit"
        assert decision.benefits["a"].benefit > 0

    def test_old_version_with_as_much_work_keeps_running(self) -> None:
        early = inst("a", 0, running=30, kv_tokens=30 * 300, response_tokens=30 * 100)
        decision = self.policy().decide(self.tick(early, {0: (0, 200), 1: (0, 200)}))
        assert decision.reasons["a"] == "no_benefit"
        assert decision.benefits["a"].benefit < 0  # the pull and re-prefill cost, nothing gained

    def test_long_contexts_near_their_end_are_not_interrupted(self) -> None:
        # 60 requests have generated 950 of ~1000 tokens: re-prefilling their 69k tokens costs
        # more than the short tail the sync would save.
        late = inst("a", 0, running=60, kv_tokens=60 * 1150, response_tokens=60 * 950)
        decision = self.policy().decide(self.tick(late, {0: (0, 0), 1: (0, 20)}, horizon=10.0))
        assert decision.reasons["a"] == "no_benefit"
        estimate = decision.benefits["a"]
        assert estimate.downtime_s > 8  # 2 s pull + ~8.5 s re-prefill

    def test_idle_instance_syncs_because_it_loses_nothing(self) -> None:
        decision = self.policy().decide(self.tick(inst("a", 0), {}))
        assert decision.reasons["a"] == "idle" and decision.instance_ids == ("a",)

    def test_threshold_is_the_minimum_benefit(self) -> None:
        early = inst("a", 0, running=30, kv_tokens=30 * 300, response_tokens=30 * 100)
        tick = self.tick(early, {0: (0, 0), 1: (0, 200)})
        benefit = self.policy().decide(tick).benefits["a"].benefit
        assert self.policy(threshold=benefit * 2).decide(tick).instance_ids == ()

    def test_benefit_grows_with_the_work_only_the_new_version_can_take(self) -> None:
        early = inst("a", 0, running=20, kv_tokens=20 * 300, response_tokens=20 * 100)
        benefits = [
            self.policy().decide(self.tick(early, {0: (0, 0), 1: (0, extra)})).benefits["a"].benefit
            for extra in (0, 10, 40, 160)
        ]
        assert benefits == sorted(benefits) and benefits[0] <= 0 < benefits[-1]
        # With no extra work both plans finish within the horizon: nothing gained, so no sync.
        assert self.policy().decide(self.tick(early, {0: (0, 0), 1: (0, 0)})).reasons["a"] == "no_benefit"

    def test_needs_a_cost_model(self) -> None:
        with pytest.raises(ValueError, match="cost model"):
            SyncPolicy(strategy(sync={"indicator": "hypothesis_test"}), partial_rollout=True)
