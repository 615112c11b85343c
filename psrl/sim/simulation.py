"""One simulated run: build the router, coordinator, fleet and trainer from a config, run, summarise."""

from __future__ import annotations

import time

from psrl.config import Config
from psrl.routing.cost_model import CostModel, load_cost_model
from psrl.sim.coordinator import SimCoordinator
from psrl.sim.engine_model import EngineShape, ModelledEngine
from psrl.sim.events import EventQueue, SimulationError
from psrl.sim.fleet import Fleet
from psrl.sim.models import SimSettings
from psrl.sim.router import SimRouter
from psrl.sim.stats import SimStats, SimSummary, steady_throughput, window_throughput
from psrl.sim.trainer import SimTrainer
from psrl.sim.workload import Workload, context_limit

STALL_S = 600.0  # simulated seconds without a finished trajectory or trained step: the run is stuck


def engine_shape(config: Config) -> EngineShape:
    engine, routing = config.engine, config.psrl.rollout_coordination.routing_strategy
    budget = routing.request_budget if routing.method == "throughput_optimal_with_budget" else None
    return EngineShape(engine.max_num_seqs, engine.num_kv_blocks * engine.block_size, engine.max_num_batched_tokens,
                       engine.block_size, routing.max_num_waiting_reqs_after_preemption, budget)  # fmt: skip


def slowed(cost: CostModel, factor: float) -> CostModel:
    """The cost model with every step and prefill taking ``factor`` times as long."""
    if factor == 1.0:
        return cost
    return CostModel(cost.k1 * factor, cost.k2 * factor, cost.k3 * factor, cost.k4 * factor, cost.kp * factor,
                     dict(cost.meta))  # fmt: skip


class Simulation:
    def __init__(self, config: Config, cost: CostModel, settings: SimSettings, label: str = "") -> None:
        """``cost`` is what the engines run on (times ``settings.engine_slowdown``); the decision code
        reads the configured ``cost_model_path`` when one is set, as the actors do, else ``cost``."""
        self.config, self.settings, self.label = config, settings, label
        self.cost = slowed(cost, settings.engine_slowdown)
        self.num_instances = settings.num_instances or config.topology.n_rollout_instances
        self.total_steps = settings.total_steps or config.trainer.total_steps
        self.clock = EventQueue()
        self.stats = SimStats()
        limit = settings.context_limit or context_limit(config)
        self.workload = Workload(config, settings.prompt_tokens, limit)
        routing = config.psrl.rollout_coordination.routing_strategy
        # The decision code reads the configured cost model, as the actors do; the engines run on ``cost``.
        decision_cost = load_cost_model(routing.cost_model_path) if routing.cost_model_path else cost
        needs_cost = routing.method.startswith("throughput_optimal")
        self.router = SimRouter(config, self.clock, decision_cost if needs_cost else None, self.stats)
        self.fleet = Fleet(self.clock, config.psrl.status_collection.engine_sync_interval_in_ms / 1000)
        self.coordinator = SimCoordinator(
            config, self.clock, self.router, self.fleet, self.workload, self.stats, cost=decision_cost,
            pull=settings.pull, total_steps=self.total_steps, stall_s=STALL_S,
        )  # fmt: skip
        self.trainer = SimTrainer(self.clock, settings.trainer, self.stats, self.coordinator.on_progress,
                                  self.coordinator.on_published)  # fmt: skip
        self._wire()

    def _wire(self) -> None:
        self.router.coordinator = self.coordinator
        self.coordinator.trainer = self.trainer
        self.fleet.on_result_sink = self.router.on_result
        self.fleet.on_loaded_sink = self._on_loaded
        self.fleet.snapshot_sinks = [self.router.on_snapshot, self.coordinator.on_snapshot]
        shape = engine_shape(self.config)
        for index in range(self.num_instances):
            engine = ModelledEngine(f"rollout-{index}", self.cost, shape, self.clock, self.fleet, version=0)
            self.fleet.add(engine)
            self.router.add_instance(engine)
        self.fleet.spread_phases()

    def _on_loaded(self, instance: str, version: int, pull_s: float, now: float) -> None:
        self.router.on_loaded(instance, version, now)
        self.coordinator.on_loaded(instance, version, pull_s, now)

    def run(self) -> SimSummary:
        started = time.perf_counter()
        for engine in self.fleet.engines.values():  # every instance reports once when it starts
            self.fleet.report(engine, 0.0)
        self.coordinator.start(0.0)
        while not self.coordinator.is_finished:
            if not self.clock.run_next():
                raise SimulationError("the simulated run ran out of events before its last step")
            if self.clock.now > self.settings.max_sim_s:
                raise SimulationError(f"the simulated run passed its limit of {self.settings.max_sim_s:.0f} s")
        self.stats.end_s = self.clock.now
        return self.summary(time.perf_counter() - started)

    def summary(self, wall_s: float) -> SimSummary:
        stats, fleet, end = self.stats, self.fleet, max(self.stats.end_s, 1e-9)
        per_s, tokens_per_s = steady_throughput(stats.steps, self.total_steps)
        instance_s = end * self.num_instances
        return SimSummary(
            label=self.label, num_instances=self.num_instances, num_steps=len(stats.steps), sim_s=end,
            trajectories_per_s=per_s, tokens_per_s=tokens_per_s,
            window_trajectories_per_s=window_throughput(stats.steps, self.total_steps, stats.first_dispatch_s),
            mean_train_s=sum(s.train_s for s in stats.steps) / len(stats.steps) if stats.steps else 0.0,
            instance_busy=fleet.total("busy_s") / instance_s, instance_syncing=fleet.total("pull_s") / instance_s,
            trainer_idle=max(0.0, 1.0 - stats.trainer_busy_s / end), staleness=dict(sorted(stats.staleness.items())),
            num_trained=stats.num_trained, num_mixed_versions=stats.num_mixed_versions,
            num_bound_violations=stats.num_bound_violations + stats.num_token_version_violations
            + stats.num_ledger_violations,
            num_wasted_tokens=stats.num_wasted_tokens,
            num_generated_tokens=int(fleet.total("num_generated_tokens")),
            num_prefill_tokens=int(fleet.total("num_prefill_tokens")), num_requests=stats.num_requests,
            num_routing_decisions=stats.num_routing_decisions, num_loopbacks=stats.num_loopbacks,
            num_syncs=int(fleet.total("num_syncs")), num_migrations=stats.num_migrations,
            num_preemptions=int(fleet.total("num_preemptions")), wall_s=wall_s,
        )  # fmt: skip


def simulate(config: Config, cost: CostModel, settings: SimSettings, label: str = "") -> SimSummary:
    return Simulation(config, cost, settings, label).run()
