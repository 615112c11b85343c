"""The modelled prefix cache: a session's next turn on the same engine prefills only what is new; the
cache lives in free KV room, giving up the least recently freed blocks first, and a weight load empties it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from psrl.engine_cost.model import CostModel, prefill_attention
from psrl.sim.engine_model import EngineRequest, EngineShape, ModelledEngine
from psrl.sim.events import EventQueue
from psrl.sim.prefix_cache import PrefixCacheModel
from tests.sim.test_engine_model import BIG, COST, Sink, make_engine, prefill_time, run

CACHED = replace(BIG, session_prefix_cache=True)


def test_the_cache_keeps_whole_blocks_but_the_last_token_and_gives_up_the_oldest_tail_first() -> None:
    cache = PrefixCacheModel(block_size=16)
    cache.keep(1, 100)  # 99 computed tokens: 6 whole blocks
    cache.keep(2, 50)
    assert cache.num_cached_tokens == 96 + 48
    cache.fit(100)  # 44 tokens too many: the older entry gives up its last 3 blocks and keeps its head
    assert cache.num_cached_tokens == 48 + 48
    assert cache.admit(1, 150) == 48 and cache.admit(2, 40) == 32  # a shorter context: never its last token
    assert cache.num_cached_tokens == 0 and cache.num_hit_tokens == 80
    cache.keep(3, 100)
    cache.keep(4, 100)
    cache.fit(90)  # more than an entry: the oldest goes whole, the next loses its tail
    assert cache.admit(3, 100) == 0 and cache.admit(4, 100) == 80


def test_blocks_given_up_go_to_the_tier_and_are_reused_after_the_head_left_on_the_device() -> None:
    cache = PrefixCacheModel(block_size=16, tier_tokens=100)
    cache.keep(1, 100)  # 96 tokens
    cache.fit(50)  # its last 48 tokens to the tier, its first 48 stay
    assert (cache.num_cached_tokens, cache.num_tier_tokens) == (48, 48)
    assert cache.admit(1, 150) == 96 and cache.num_tier_hit_tokens == 48  # the head, then the tier's part


def test_a_full_tier_gives_up_the_tail_of_its_oldest_entry_first() -> None:
    cache = PrefixCacheModel(block_size=16, tier_tokens=100)
    cache.keep(1, 100)  # 96 tokens
    cache.keep(2, 50)  # 48 tokens
    cache.fit(50)  # entry 1 goes to the tier whole
    assert (cache.num_cached_tokens, cache.num_tier_tokens) == (48, 96)
    cache.keep(3, 70)  # 64 tokens
    cache.fit(0)  # 2 and 3 go too: the tier keeps 100 tokens, giving up 1 whole and 2's tail
    assert cache.num_tier_tokens == 96
    assert cache.admit(1, 150) == 0 and cache.admit(2, 60) == 32 and cache.admit(3, 80) == 64
    assert cache.num_tier_hit_tokens == 96
    cache.keep(4, 2000)  # bigger than the whole tier: what the tier keeps is its head
    cache.fit(0)
    assert cache.admit(4, 2000) == 96


def _turns(shape: EngineShape, *, sync_between: bool = False) -> tuple[list[int], float]:
    engine, clock, _ = make_engine(shape)
    engine.add(0.0, EngineRequest(7, 1000, 0, 10, 0))  # first turn: 1,000 prompt tokens, 10 generated
    run(clock)
    if sync_between:
        engine.sync(clock.now, 4, 0.5, abort_running=False)
        run(clock)
    started = clock.now
    engine.add(clock.now, EngineRequest(7, 1000 + 10 + 200, 0, 5, 1))  # the next turn: + a 200-token tool output
    run(clock)
    return [engine.counters.num_prefill_tokens, engine.counters.num_prefix_hit_tokens], clock.now - started


def test_a_sessions_next_turn_prefills_only_what_its_last_turn_did_not_compute() -> None:
    counts, _ = _turns(CACHED)
    reused = (1000 + 10 - 1) // 16 * 16  # 1,008: every whole block of the first turn's context
    assert counts == [1000 + (1210 - reused), reused]
    uncached, _ = _turns(BIG)
    assert uncached == [1000 + 1210, 0]


def test_the_cached_turn_takes_less_time_by_the_prefill_it_saves() -> None:
    _, cached_s = _turns(CACHED)
    _, plain_s = _turns(BIG)
    budget = BIG.max_num_batched_tokens
    saved = prefill_time(1210, budget) - prefill_time(1210 - 1008, budget)
    assert abs((plain_s - cached_s) - saved) < 1e-9 and COST.kp > 0


def test_a_turns_new_tokens_also_pay_for_attending_to_the_cached_prefix() -> None:
    with_attention = replace(COST, ka=2e-9)

    def second_turn_s(cost: CostModel) -> float:
        clock = EventQueue()
        engine = ModelledEngine("i0", cost, CACHED, clock, Sink(), version=3)
        engine.add(0.0, EngineRequest(7, 1000, 0, 10, 0))
        run(clock)
        started = clock.now
        engine.add(clock.now, EngineRequest(7, 1210, 0, 5, 1))
        run(clock)
        return clock.now - started

    extra = second_turn_s(with_attention) - second_turn_s(COST)
    assert extra == pytest.approx(with_attention.ka * prefill_attention(1210 - 1008, 1008), rel=1e-9)


def test_a_weight_load_empties_the_modelled_cache() -> None:
    counts, _ = _turns(CACHED, sync_between=True)
    assert counts == [1000 + 1210, 0]


def test_the_agentic_comparison_varies_only_routing_stickiness_and_thunderagent() -> None:
    from psrl.config import load_config
    from psrl.sim.scenarios import comparison

    rows = comparison("agentic")
    configs = [load_config("agentic", list(v.overrides)).psrl.rollout_coordination for v in rows]
    assert [(c.routing_strategy.method, c.routing_strategy.enable_trajectory_sticky,
             c.session_strategy.thunder_agent.enable) for c in configs] == [
        ("request_num_balance", False, False), ("cache_aware_v1", True, False), ("cache_aware_v1", True, True)
    ]  # fmt: skip
