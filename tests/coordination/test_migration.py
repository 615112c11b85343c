"""Migration: starved-instance detection, safe ratios, thresholds, scope, and the tick order."""

from __future__ import annotations

import math

import msgspec
from coordination_helpers import COST, inputs, inst, strategy

from psrl.config.coordination import MigrationStrategy
from psrl.coordination.migration import decide_migration, starved_instances
from psrl.coordination.state import CoordinationInputs, safe_ratio
from psrl.coordination.sync import SyncPolicy
from psrl.coordination.tick import TickDecision, decide_tick


def mig(**fields: object) -> MigrationStrategy:
    values: dict[str, object] = {"enable": True, "threshold": 2.0, "stop_threshold": 10.0}
    values.update(fields)
    return MigrationStrategy(**values)


def test_ratios_are_safe_at_zero() -> None:
    assert safe_ratio(0, 0) == 0.0
    assert safe_ratio(0, 5) == 0.0
    assert safe_ratio(5, 0) == math.inf
    assert safe_ratio(6, 3) == 2.0


class TestStarved:
    def test_starved_means_idle_queue_live_version_and_nothing_to_take(self) -> None:
        tick = inputs(
            2,
            inst("idle", 2),
            inst("waiting", 2, waiting=1),
            inst("dead_version", 0),
            inst("has_work", 1),
            inst("stale", 2, report_version=1, stale_report_version=1),
            servable={1: (0, 4), 2: (0, 0), 0: (0, 0)},
            max_aborted_version=0,
        )
        assert [i.instance_id for i in starved_instances(tick)] == ["idle"]


class TestDecision:
    def test_busiest_older_or_equal_instance_migrates_to_the_starved_one(self) -> None:
        tick = inputs(
            1, inst("s", 1, running=1), inst("a", 1, running=30), inst("b", 0, running=60), inst("c", 2, running=90)
        )
        decision = decide_migration(tick, mig())
        # c runs a newer version than s (its requests could not continue on s); b is the busiest eligible.
        assert decision is not None and (decision.source_id, decision.starved_id) == ("b", "s")
        assert decision.ratio == 60 and decision.num_to_move is None

    def test_idle_starved_instance_gives_an_infinite_ratio(self) -> None:
        decision = decide_migration(inputs(0, inst("s", 0), inst("a", 0, running=12)), mig())
        assert decision is not None and decision.ratio == math.inf

    def test_ratio_threshold(self) -> None:
        tick = inputs(0, inst("s", 0, running=10), inst("a", 0, running=20))
        assert decide_migration(tick, mig(threshold=2.0)) is None  # 2.0 is not above 2.0
        assert decide_migration(tick, mig(threshold=1.5)) is not None

    def test_stop_threshold_skips_instances_with_too_little_load(self) -> None:
        tick = inputs(0, inst("s", 0), inst("a", 0, running=8), inst("b", 0, running=12, throughput=5.0))
        assert decide_migration(tick, mig()).source_id == "b"  # type: ignore[union-attr]
        assert decide_migration(tick, mig(stop_threshold=20.0)) is None
        by_throughput = mig(stop_indicator="throughput", stop_threshold=4.0)
        assert decide_migration(tick, by_throughput).source_id == "b"  # type: ignore[union-attr]

    def test_other_indicators(self) -> None:
        tick = inputs(0, inst("s", 0, kv_usage=0.1, running=1), inst("a", 0, kv_usage=0.9, running=11))
        decision = decide_migration(tick, mig(indicator="kv_cache", threshold=5.0))
        assert decision is not None and round(decision.ratio, 6) == 9.0

    def test_excess_scope_moves_half_the_difference(self) -> None:
        tick = inputs(0, inst("s", 0, running=2), inst("a", 0, running=40))
        decision = decide_migration(tick, mig(scope="excess"))
        assert decision is not None and decision.num_to_move == 19

    def test_disabled_or_unset_threshold_never_migrates(self) -> None:
        tick = inputs(0, inst("s", 0), inst("a", 0, running=50))
        assert decide_migration(tick, mig(enable=False)) is None
        assert decide_migration(tick, mig(threshold=None)) is None

    def test_syncing_instances_are_neither_source_nor_target(self) -> None:
        tick = inputs(0, inst("s", 0, is_syncing=True), inst("a", 0, running=50))
        assert decide_migration(tick, mig()) is None


class TestTick:
    def test_migration_is_considered_only_when_no_sync_happens(self) -> None:
        settings = strategy("greedy", mig={"enable": True, "threshold": 2.0, "stop_threshold": 10.0})
        policy = SyncPolicy(settings, partial_rollout=True)
        lagging = decide_tick(inputs(1, inst("s", 0), inst("a", 0, running=50)), policy, settings)
        assert lagging.sync.instance_ids == ("s", "a") and lagging.migration is None
        current = decide_tick(inputs(0, inst("s", 0), inst("a", 0, running=50)), policy, settings)
        assert current.sync.instance_ids == () and current.migration is not None
        mid_sync = decide_tick(
            inputs(0, inst("s", 0), inst("a", 0, running=50), inst("b", 0, is_syncing=True)), policy, settings
        )
        assert mid_sync.migration is None


def test_a_recorded_tick_replays_to_the_same_decision() -> None:
    settings = strategy(
        sync={"indicator": "hypothesis_test"}, mig={"enable": True, "threshold": 2.0, "stop_threshold": 1.0}
    )
    policy = SyncPolicy(settings, partial_rollout=True, cost_model=COST)
    tick = inputs(
        1,
        inst("a", 0, running=30, kv_tokens=9000, response_tokens=3000),
        inst("b", 1, report_version=1),
        inst("c", 1, report_version=1, running=12),
        servable={0: (0, 0), 1: (0, 200)},
        mean_prompt_tokens=200,
        mean_response_tokens=1000,
    )
    decision = decide_tick(tick, policy, settings)
    wire_inputs = msgspec.msgpack.decode(msgspec.msgpack.encode(tick), type=CoordinationInputs)
    wire_decision = msgspec.msgpack.decode(msgspec.msgpack.encode(decision), type=TickDecision)
    assert decide_tick(wire_inputs, policy, settings) == wire_decision == decision
    assert decision.sync.instance_ids == ("a",) and decision.migration is None
