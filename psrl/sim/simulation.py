"""One simulated run: the real router and coordinator flows, modelled engines and trainer, a simulated clock.

The in-process driver's loop (``psrl.flows.driver``) with the parts that cost time replaced by
models: instances are ``ModelledEngine``s (``psrl.sim.fleet``), the trainer takes modelled time
per chunk (``psrl.sim.trainer``) and the clock jumps from event to event (``EventQueue``). The
router and the coordinator are the flows the actors run (``RouterFlow``, ``CoordinatorFlow``);
the simulation only delivers their messages, runs a routing pass after the router handled
something (as the actor's loop does), and fires their timers.
"""

from __future__ import annotations

import time

from bus.messages import EnvStepDone
from psrl.config import Config
from psrl.engine_cost.model import CostModel, load_cost_model
from psrl.flows.coordinator import CoordinatorFlow
from psrl.flows.effects import Timer
from psrl.flows.local import LocalBus
from psrl.flows.router import RouterFlow
from psrl.flows.session import SessionFlow
from psrl.sim.engine_model import EngineShape, ModelledEngine
from psrl.sim.events import EventQueue, SimulationError
from psrl.sim.fleet import Fleet, ModelledInstance
from psrl.sim.models import SimSettings
from psrl.sim.sessions import SimEnv
from psrl.sim.stats import SimStats, SimSummary, StatsTap, steady_throughput, window_throughput
from psrl.sim.trainer import NAME as TRAINER
from psrl.sim.trainer import SimTrainer
from psrl.sim.workload import Workload, context_limit

STALL_S = 600.0  # simulated seconds without a finished trajectory or trained step: the run is stuck


def engine_shape(config: Config) -> EngineShape:
    engine, routing = config.engine, config.psrl.rollout_coordination.routing_strategy
    budget = routing.request_budget if routing.method == "throughput_optimal_with_budget" else None
    return EngineShape(
        engine.max_num_seqs,
        engine.num_kv_blocks * engine.block_size,
        engine.max_num_batched_tokens,
        engine.block_size,
        routing.max_num_waiting_reqs_after_preemption,
        budget,
        session_prefix_cache=config.env.enable and engine.enable_prefix_caching,
        decode_steps=engine.decode_steps if _has_decode_rounds(config) else 1,
    )


def _has_decode_rounds(config: Config) -> bool:
    """The embedded engine samples rounds of ``engine.decode_steps`` tokens with its GPU step kernels (a run
    whose config names ``topology.device=cuda``: ``auto`` is read as the CPU, where a simulation usually runs)."""
    engine = config.engine
    return config.topology.device == "cuda" and engine.backend == "embedded" and engine.gpu_kernels != "off"


def simulated_config(config: Config, num_instances: int, total_steps: int) -> Config:
    """The run's config as the simulated fleet has it: its size, its steps, one trainer, no group filter
    (a simulation has no rewards, so it keeps every group)."""
    topology = config.topology.model_copy(update={"n_rollout_instances": num_instances, "n_trainer_ranks": 1})
    trainer = config.trainer.model_copy(update={"total_steps": total_steps})
    filter_groups = config.algorithm.filter_groups.model_copy(update={"enable": False})
    algorithm = config.algorithm.model_copy(update={"filter_groups": filter_groups})
    return config.model_copy(update={"topology": topology, "trainer": trainer, "algorithm": algorithm})


class Simulation:
    def __init__(self, config: Config, cost: CostModel, settings: SimSettings, label: str = "") -> None:
        """``cost`` is what the engines run on (times ``settings.engine_slowdown``); the decision code
        reads the configured ``cost_model_path`` when one is set, as the actors do, else ``cost``."""
        self.settings, self.label = settings, label
        self.cost = cost.scaled(settings.engine_slowdown)
        self.num_instances = settings.num_instances or config.topology.n_rollout_instances
        self.total_steps = settings.total_steps or config.trainer.total_steps
        self.config = simulated_config(config, self.num_instances, self.total_steps)
        self.clock = EventQueue()
        self.stats = SimStats()
        limit = settings.context_limit or context_limit(config)
        self.workload = Workload(config, settings.prompt_tokens, limit)
        routing = config.psrl.rollout_coordination.routing_strategy
        decision_cost = load_cost_model(routing.cost_model_path) if routing.cost_model_path else cost
        needs_cost = routing.method.startswith("throughput_optimal")
        self.bus = LocalBus(tap=StatsTap(self.stats, self.config.responses_per_prompt))
        self.router = RouterFlow(self.config, cost=decision_cost if needs_cost else None, record_decisions=False)
        self.coordinator = CoordinatorFlow(
            self.config, self.workload, self.workload, cost=decision_cost, record_decisions=False
        )
        self.fleet = Fleet(self.clock, self.bus, config.psrl.status_collection.engine_sync_interval_in_ms / 1000)
        self.trainer = SimTrainer(self.clock, self.bus, settings.trainer, self.stats, self.config.psrl.staleness)
        self.session: SessionFlow | None = None
        if self.config.env.enable:  # multi-turn sessions: the real scheduler, modelled environments
            env = SimEnv(self.clock, self.config.env, self._env_answered, settings.observation_tokens)
            self.session = SessionFlow(self.config, env)
        self._is_route_due = False
        self._wire()

    def _wire(self) -> None:
        self.bus.attach("router", self.router, RouterFlow.BUS_KINDS)
        self.bus.attach("coordinator", self.coordinator, CoordinatorFlow.BUS_KINDS)
        self.bus.attach(TRAINER, self.trainer)
        if self.session is not None:
            self.bus.attach("session", self.session, SessionFlow.BUS_KINDS)
        shape = engine_shape(self.config)
        for index in range(self.num_instances):
            engine = ModelledEngine(f"rollout-{index}", self.cost, shape, self.clock, self.fleet, version=0)
            self.fleet.add(ModelledInstance(engine, index, self.settings.pull))
        self.fleet.spread_phases()

    def run(self) -> SimSummary:
        started = time.perf_counter()
        self.bus.post("router", self.router.start(0.0), 0.0)
        for engine in self.fleet.engines.values():  # every instance reports once when it starts
            self.fleet.report(engine, 0.0)
        self.bus.post("coordinator", self.coordinator.start(0.0), 0.0)
        self._deliver(0.0)
        flows = [("router", self.router), ("coordinator", self.coordinator)]
        for owner, flow in flows + ([("session", self.session)] if self.session is not None else []):
            for timer in flow.timers():
                self._every(owner, timer, 0.0)
        while not self.coordinator.is_finished:
            if not self.clock.run_next():
                raise SimulationError("the simulated run ran out of events before its last step")
            self._deliver(self.clock.now)
            if self.clock.now > self.settings.max_sim_s:
                raise SimulationError(f"the simulated run passed its limit of {self.settings.max_sim_s:.0f} s")
        self.stats.end_s = self.clock.now
        self.stats.num_loopbacks = self.router.tracker.num_loopbacks
        self.stats.num_wasted_tokens = self.router.tracker.num_wasted_tokens
        return self.summary(time.perf_counter() - started)

    # ------------------------------------------------------------------ delivery, routing, timers

    def _deliver(self, now: float) -> None:
        """Every message the last event caused is handled; a routing pass follows the router's inputs."""
        if "router" in self.bus.deliver(now) and self.router.has_work and not self._is_route_due:
            self._is_route_due = True
            self.clock.at(now, self._route)

    def _env_answered(self, done: EnvStepDone, now: float) -> None:
        if self.session is not None:
            self.bus.post("session", self.session.handle(done, now), now)
            self._deliver(now)

    def _route(self, now: float) -> None:
        self._is_route_due = False
        self.bus.post("router", self.router.route(now), now)

    def _every(self, owner: str, timer: Timer, now: float) -> None:
        self.clock.at(now + timer.interval_s, lambda t: self._fire(owner, timer, t))

    def _fire(self, owner: str, timer: Timer, now: float) -> None:
        if self.coordinator.is_finished:
            return
        if owner == "coordinator":
            self._check_progress(now)
        self.bus.post(owner, timer.callback(now), now)
        self._every(owner, timer, now)

    def _check_progress(self, now: float) -> None:
        self.stats.num_ticks += 1
        if now - self.stats.last_progress_s > STALL_S and self._is_quiet():
            raise SimulationError(self._stall_report(now))

    def _is_quiet(self) -> bool:
        """Nothing is working that could move the run on: no engine has work, the trainer is idle."""
        engines_busy = any(e.num_unfinished or e.is_pulling for e in self.fleet.engines.values())
        return not self.trainer.is_busy and not engines_busy

    def _stall_report(self, now: float) -> str:
        core, ledger = self.router.core, self.router.ledger
        busy = sum(1 for e in self.fleet.engines.values() if e.num_unfinished)
        return (
            f"the simulated run stalled: nothing finished for {now - self.stats.last_progress_s:.0f} s "
            f"(t={now:.1f} s, ps_version={self.coordinator.ps_version}, queued={core.num_queued}, "
            f"live={len(self.router.tracker.live)}, instances with work={busy}, ledger={ledger.counts()})"
        )

    # ------------------------------------------------------------------ the figures

    def summary(self, wall_s: float) -> SimSummary:
        stats, fleet, end = self.stats, self.fleet, max(self.stats.end_s, 1e-9)
        per_s, tokens_per_s = steady_throughput(stats.steps, self.total_steps)
        instance_s = end * self.num_instances
        return SimSummary(
            label=self.label,
            num_instances=self.num_instances,
            num_steps=len(stats.steps),
            sim_s=end,
            trajectories_per_s=per_s,
            tokens_per_s=tokens_per_s,
            window_trajectories_per_s=window_throughput(stats.steps, self.total_steps, stats.first_dispatch_s),
            mean_train_s=sum(s.train_s for s in stats.steps) / len(stats.steps) if stats.steps else 0.0,
            instance_busy=fleet.total("busy_s") / instance_s,
            instance_syncing=fleet.total("pull_s") / instance_s,
            trainer_idle=max(0.0, 1.0 - stats.trainer_busy_s / end),
            staleness=dict(sorted(stats.staleness.items())),
            num_trained=stats.num_trained,
            num_mixed_versions=stats.num_mixed_versions,
            num_bound_violations=stats.num_bound_violations
            + stats.num_token_version_violations
            + stats.num_ledger_violations,
            num_wasted_tokens=stats.num_wasted_tokens,
            num_generated_tokens=int(fleet.total("num_generated_tokens")),
            num_prefill_tokens=int(fleet.total("num_prefill_tokens")),
            num_requests=stats.num_requests,
            num_routing_decisions=stats.num_routing_decisions,
            num_loopbacks=stats.num_loopbacks,
            num_syncs=int(fleet.total("num_syncs")),
            num_migrations=stats.num_migrations,
            num_preemptions=int(fleet.total("num_preemptions")),
            wall_s=wall_s,
        )


def simulate(config: Config, cost: CostModel, settings: SimSettings, label: str = "") -> SimSummary:
    return Simulation(config, cost, settings, label).run()
