"""The agent workload on modelled engines (psrl.sim.agentic): the real router and session scheduler,
simulated clock; sticky placement reuses what balancing re-prefills, and each run is deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest

from psrl.config import load_config
from psrl.engine_cost.model import load_cost_model
from psrl.sim.agent_workload import AgentWorkload
from psrl.sim.agentic import AgentSimulation

COST = load_cost_model(Path(__file__).resolve().parents[2] / "psrl" / "sim" / "demo_cost_model.json")
RC = "psrl.rollout_coordination."
WORKLOAD = AgentWorkload(sessions=8, prompt_tokens=(512, 1024), turns=(4, 8), gen_tokens=(8, 24),
                         tool_tokens=(32, 128), tool_median_s=0.2, tool_sigma=1.0, max_context=2048,
                         vocab=(2, 48), ramp_s=1.0)  # fmt: skip


def run(
    *overrides: str, engines_per_device: int = 1, tier_tokens: int = 0, tier_copy_s: float = 0.0
) -> tuple[int, int, int]:
    config = load_config(
        "agentic",
        ["topology.n_rollout_instances=2", "engine.num_kv_blocks=512", "engine.max_num_seqs=8", "psrl.rollout_n=1",
         "algorithm.adv_estimator=reinforce_plus_plus", "psrl.staleness_buffer_entries=4096",
         "actor.ppo_mini_batch_size=4096", "env.max_turns=8", "env.max_turn_tokens=24", *overrides],
    )  # fmt: skip
    simulation = AgentSimulation(
        config, WORKLOAD, COST, engines_per_device=engines_per_device, tier_tokens=tier_tokens,
        tier_copy_s_per_token=tier_copy_s,
    )  # fmt: skip
    out = simulation.run(30.0)
    return out.turns, out.hit_tokens, out.prefill_tokens


def test_sticky_sessions_reuse_their_context_on_modelled_engines() -> None:
    balance = run(
        RC + "routing_strategy.method=request_num_balance", RC + "routing_strategy.enable_trajectory_sticky=false"
    )
    sticky = run()
    assert balance[0] > 50 and sticky[0] > 50
    assert sticky[1] > balance[1] and sticky[2] < balance[2]  # more hits, less prefill
    assert run() == sticky  # deterministic


def test_engines_taking_turns_on_one_device_finish_fewer_turns() -> None:
    """The benchmark steps its engines one after another on one device: each step waits for the others'."""
    alone, sharing = run()[0], run(engines_per_device=2)[0]
    assert sharing < alone
    with pytest.raises(ValueError, match="engines_per_device"):
        run(engines_per_device=0)


def test_where_the_kv_binds_an_offload_tier_keeps_what_the_cache_pushes_out() -> None:
    """192 blocks per instance for 4 sessions of 0.5-2k tokens each: without a tier their contexts are
    pushed out and prefilled again; a tier that holds them turns that prefill into reuse."""
    small = [RC + "session_strategy.thunder_agent.enable=false", "engine.num_kv_blocks=192"]
    without = run(*small)
    tiered = run(*small, tier_tokens=64 * 1024)
    assert tiered[1] > without[1] and tiered[2] < without[2] and tiered[0] > without[0]
    assert run(*small, tier_tokens=0) == without  # no room in the tier: the same run as none
    assert run(*small, tier_tokens=64 * 1024, tier_copy_s=1e-4)[0] < tiered[0]  # loads that cost time


def test_every_turn_is_timed_from_ready_to_its_first_token() -> None:
    config = load_config(
        "agentic",
        ["topology.n_rollout_instances=2", "engine.num_kv_blocks=512", "engine.max_num_seqs=8", "psrl.rollout_n=1",
         "algorithm.adv_estimator=reinforce_plus_plus", "psrl.staleness_buffer_entries=4096",
         "actor.ppo_mini_batch_size=4096", "env.max_turns=8", "env.max_turn_tokens=24"],
    )  # fmt: skip
    alone = AgentSimulation(config, WORKLOAD, COST).run(30.0)
    sharing = AgentSimulation(config, WORKLOAD, COST, engines_per_device=2).run(30.0)
    for out in (alone, sharing):
        # a turn is timed when its first token comes: the finished ones, and those still generating at the end
        assert out.turns <= len(out.ttft_s) <= out.turns + WORKLOAD.sessions
        assert min(out.ttft_s) > 0 and out.ttft(0.5) <= out.ttft(0.99)
    assert sharing.ttft(0.5) > alone.ttft(0.5)  # a turn waits for the other engine's phases too
