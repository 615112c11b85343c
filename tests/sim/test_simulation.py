"""Whole simulated runs: the flow around the real decision code, and what each setting changes."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from psrl.config import load_config
from psrl.engine_cost.model import CostModel
from psrl.errors import ConfigError
from psrl.sim.cli import main
from psrl.sim.defaults import DEMO_COST_MODEL, demo_cost_model, load_run_models
from psrl.sim.events import SimulationError
from psrl.sim.models import PullModel, SimSettings, TrainerModel
from psrl.sim.scenarios import ROUTING, SYNC_MIG
from psrl.sim.simulation import Simulation, engine_shape
from psrl.sim.stats import SimSummary

COST = demo_cost_model()
SETTINGS = SimSettings(TrainerModel(step_s=0.05, token_s=2e-5, publish_s=0.01), PullModel((0.005, 0.02, 0.04)),
                       prompt_tokens=24)  # fmt: skip
LONG = ("task.max_response_length=400", "task.long_tail_median=96")  # rollout slower than training: syncs interrupt
COST_PATH = f"{ROUTING}cost_model_path={DEMO_COST_MODEL}"


def run(*overrides: str, preset: str = "demo", settings: SimSettings = SETTINGS) -> tuple[Simulation, SimSummary]:
    config = load_config(preset, ["task.response_lengths=long_tail", "trainer.total_steps=6", *overrides])
    simulation = Simulation(config, COST, settings)
    return simulation, simulation.run()


def test_demo_trains_complete_buffers_within_the_staleness_bound() -> None:
    simulation, summary = run(settings=dataclasses.replace(SETTINGS, prompt_tokens=None))  # the task's prompts
    assert [s.step for s in simulation.stats.steps] == list(range(1, 7))
    per_step = simulation.config.psrl.staleness_buffer_entries * simulation.config.psrl.rollout_n
    assert all(s.num_trajectories == per_step for s in simulation.stats.steps)
    assert summary.num_bound_violations == 0
    assert set(summary.staleness) <= {0, 1, 2} and summary.num_trained == sum(summary.staleness.values())
    # the simulator's own count and the ledger's agree trajectory for trajectory
    assert dict(simulation.stats.ledger_staleness) == summary.staleness
    assert summary.trajectories_per_s > 0 and 0 < summary.instance_busy < 1
    _, again = run(settings=dataclasses.replace(SETTINGS, prompt_tokens=None))
    assert dataclasses.replace(again, wall_s=0) == dataclasses.replace(summary, wall_s=0)  # deterministic


def test_synchronous_baseline_trains_only_fresh_trajectories() -> None:
    _, summary = run(*LONG, preset="sync")
    assert set(summary.staleness) == {0}
    assert summary.num_loopbacks == 0 and summary.num_wasted_tokens == 0 and summary.num_mixed_versions == 0
    assert summary.trainer_idle > 0.2  # it waits for every rollout


def test_partial_rollout_continues_interrupted_trajectories_on_new_weights() -> None:
    _, partial = run(*LONG, f"{SYNC_MIG}method=greedy")
    assert partial.num_loopbacks > 0 and partial.num_mixed_versions > 0
    assert partial.num_wasted_tokens == 0 and partial.num_bound_violations == 0
    _, whole = run(*LONG, "psrl.rollout_coordination.partial_rollout.enable=false")
    assert whole.num_loopbacks == 0 and whole.num_mixed_versions == 0
    assert partial.trajectories_per_s != whole.trajectories_per_s


def test_redundant_rollout_keeps_n_per_group_and_wastes_the_surplus() -> None:
    red = "psrl.rollout_coordination.redundant_rollout."
    simulation, summary = run(*LONG, f"{red}enable=true", "psrl.rollout_n=4", f"{red}redundant_rollout_n=6")
    assert all(
        s.num_trajectories == simulation.config.psrl.staleness_buffer_entries * 4 for s in simulation.stats.steps
    )
    assert summary.num_wasted_tokens > 0 and summary.num_bound_violations == 0


@pytest.mark.parametrize(
    "method", ["random", "round_robin", "request_num_balance", "throughput_optimal", "throughput_optimal_with_budget",
               "cache_aware", "cache_aware_v1"],
)  # fmt: skip
def test_every_routing_method_runs_within_the_bound(method: str) -> None:
    simulation, summary = run(*LONG, f"{ROUTING}method={method}", COST_PATH, "topology.n_rollout_instances=3")
    assert summary.num_steps == 6 and summary.num_bound_violations == 0
    assert simulation.router.core.policy.name == method
    loads = [e.counters.num_generated_tokens for e in simulation.fleet.engines.values()]
    assert all(load > 0 for load in loads)  # every method spreads work over the instances


def test_the_simulation_drives_the_actors_flows() -> None:
    from psrl.flows.coordinator import CoordinatorFlow
    from psrl.flows.router import RouterFlow

    simulation, _ = run()
    assert type(simulation.router) is RouterFlow and type(simulation.coordinator) is CoordinatorFlow
    assert set(simulation.router.instances) == {"rollout-0", "rollout-1"}
    assert [s.step for s in simulation.stats.steps] == list(range(1, 7))


def test_routing_method_changes_the_placement() -> None:
    balanced, _ = run(*LONG, "topology.n_rollout_instances=3")
    drawn, _ = run(*LONG, "topology.n_rollout_instances=3", f"{ROUTING}method=random")
    tokens = [[e.counters.num_generated_tokens for e in s.fleet.engines.values()] for s in (balanced, drawn)]
    assert tokens[0] != tokens[1]


@pytest.mark.parametrize(
    "sync",
    [("greedy",), ("status_based", "sync.indicator=request_num", "sync.threshold=4"),
     ("status_based", "sync.indicator=kv_cache", "sync.threshold=0.2"),
     ("status_based", "sync.indicator=hypothesis_test")],
)  # fmt: skip
def test_sync_strategies_run_within_the_bound(sync: tuple[str, ...]) -> None:
    method, *rest = sync
    _, summary = run(*LONG, f"{SYNC_MIG}method={method}", *(f"{SYNC_MIG}{o}" for o in rest), COST_PATH)
    assert summary.num_steps == 6 and summary.num_bound_violations == 0 and summary.num_syncs > 0


def test_reasoning_profile_migrates_and_continues_the_moved_requests() -> None:
    _, summary = run(*LONG, "topology.n_rollout_instances=4", preset="reasoning")
    assert summary.num_migrations > 0
    assert summary.num_loopbacks >= summary.num_migrations and summary.num_wasted_tokens == 0
    assert summary.num_bound_violations == 0


def test_the_staleness_check_counts_what_breaks_the_bound() -> None:
    import numpy as np

    from bus.messages import TrainData

    simulation, _ = run()
    stats = simulation.stats
    before = stats.num_bound_violations, stats.num_token_version_violations, stats.num_mixed_versions
    ints = np.zeros(1, np.int32)
    versions = np.asarray([1] * 5 + [9] * 3, np.int32)
    data = TrainData(
        step=5,
        buffer=4,
        chunk=0,
        num_chunks=1,
        prompt_ids=ints,
        request_ids=ints,
        v_traj=np.ones(1, np.int32),
        prompt_lengths=ints,
        response_lengths=np.asarray([8], np.int32),
        prompt_token_ids=ints[:0],
        response_token_ids=np.zeros(8, np.int32),
        response_logprobs=np.zeros(8, np.float32),
        response_versions=versions,
        rewards=np.zeros(1, np.float32),
        accs=np.zeros(1, np.float32),
        finish_reasons=ints,
    )
    simulation.trainer.check_staleness(data)  # eta = 2: staleness 3, and 3 tokens of a version after the buffer
    after = stats.num_bound_violations, stats.num_token_version_violations, stats.num_mixed_versions
    assert after == (before[0] + 1, before[1] + 3, before[2] + 1)


def test_run_limits_and_bad_settings() -> None:
    with pytest.raises(SimulationError, match="limit"):
        run(*LONG, settings=dataclasses.replace(SETTINGS, max_sim_s=0.5))
    with pytest.raises(ConfigError, match=r"sim\.pull_s"):
        PullModel(())
    with pytest.raises(ConfigError, match=r"sim\.trainer\.token_s"):
        TrainerModel(0.1, -1.0)
    with pytest.raises(ConfigError, match="long_tail"):
        Simulation(load_config("demo", []), COST, SETTINGS)


def test_engine_shape_follows_the_config() -> None:
    config = load_config(
        "demo", [f"{ROUTING}method=throughput_optimal_with_budget", COST_PATH, "engine.num_kv_blocks=64"]
    )
    shape = engine_shape(config)
    assert (
        shape.kv_capacity_tokens == 64 * 16
        and shape.request_budget == config.psrl.rollout_coordination.routing_strategy.request_budget
    )
    assert engine_shape(load_config("demo", [])).request_budget is None


def test_cli_compares_sync_settings_and_prints_the_speedup() -> None:
    result = CliRunner().invoke(main, ["--compare", "sync", "trainer.total_steps=4", "--prompt-tokens", "20",
                                       "--trainer-step-s", "0.05", "--trainer-token-s", "0.00002"])  # fmt: skip
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("RESULT speedup_vs_sync=") and last.endswith("violations=0")
    assert "psrl, status_based hypothesis_test" in result.output


def test_cli_refuses_bad_input() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["demo", "no.such_key=1"]).exit_code == 2
    assert runner.invoke(main, ["--cost-model", "/no/such/file.json"]).exit_code == 2


def test_demo_cost_model_is_sane() -> None:
    model = CostModel.load(DEMO_COST_MODEL)
    assert model.throughput(64, 3000) > model.throughput(8, 500) > model.throughput(1, 100) > 0


def test_groups_dispatched_ahead_are_not_re_decided_on_every_ledger_change(monkeypatch) -> None:
    """At a version boundary the groups dispatched ahead cannot reserve until instances sync; each
    occupy in between must not re-decide all of them (that made large fleets quadratic)."""
    from psrl.routing.core import RouterCore
    from psrl.sim.scenarios import PSRL

    outcomes: list[bool] = []
    decide = RouterCore._decide

    def counted(self: RouterCore, request):  # type: ignore[no-untyped-def]
        result = decide(self, request)
        outcomes.append(result[0].is_routed)
        return result

    monkeypatch.setattr(RouterCore, "_decide", counted)
    demo_trainer, _ = load_run_models()  # the demo's trainer, data parallel over 8 ranks, 16x faster
    trainer = TrainerModel(demo_trainer.step_s / 16, demo_trainer.token_s / 128, demo_trainer.publish_s)
    settings = dataclasses.replace(SETTINGS, num_instances=16, trainer=trainer)
    run("psrl.staleness_buffer_entries=128", "trainer.total_steps=4", *PSRL.overrides, settings=settings)
    num_routed = sum(outcomes)
    # About 0.4 refusals per routed request; re-deciding on every change made it about 2.8.
    assert num_routed > 0 and len(outcomes) - num_routed <= num_routed
