"""The agent workload on modelled engines: what ``tools/bench_agentic.py`` measures, predicted.

The same sessions (``psrl.sim.agent_workload``) run on the real router and session scheduler, as in
the benchmark, but on modelled engines (``psrl.sim.engine_model``, with each session's prefix cache)
and the simulated clock: the tools' delays are events, engine steps cost what the cost model says.
Nothing trains. ``AgentSimulation(config, workload, cost).run(budget_s)`` gives the turns and
sessions finished in ``budget_s`` simulated seconds, the prefill the prefix cache saved, KV
preemptions, hung session-seconds and each turn's time to its first token (from when its prompt or
its tool's output arrived, a hold by ThunderAgent included): the figures the benchmark prints for
one setting.

``engines_per_device``: how many instances take turns on one device. The benchmark steps all its
engines one after another in one thread on one GPU, so while the others have work each engine's step
waits for theirs: a phase planned while ``k`` others on its device are busy costs ``1 + k`` times its
own time (``psrl.sim.engine_model.SharedDevice``; on the GPU run, busy about 98% of its time, that is
twice; on 2 CPU cores, where the engines idle part of it, less). A fleet with a device per instance
is 1, the default.

``tier_tokens``: the KV offload tier's room per instance, in tokens (``psrl.lmcache``; 0 = none): a
session's context pushed out of the KV cache is kept there and reused when its next turn comes
(``psrl.sim.prefix_cache``), each token loaded back costing ``tier_copy_s_per_token`` (its copy to
the tier and back; on a shared device the copies wait for the other engines like their steps do).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bus.messages import GenerateRequest, SessionEnd, TurnDone
from psrl.config import Config
from psrl.engine_cost.model import CostModel
from psrl.flows.effects import Effect, Send, Timer
from psrl.flows.local import LocalBus
from psrl.flows.router import RouterFlow
from psrl.reliability.faults import percentile
from psrl.sim.agent_workload import AgentSessions, AgentSource, AgentWorkload, SyntheticTools, TurnClock
from psrl.sim.engine_model import ModelledEngine, SharedDevice
from psrl.sim.events import EventQueue
from psrl.sim.fleet import Fleet, ModelledInstance
from psrl.sim.models import PullModel
from psrl.sim.simulation import engine_shape

SOURCE_TICK_S = 0.05  # the ramp opens sessions at this pace


@dataclass
class AgentSimOutcome:
    sim_s: float
    turns: int
    sessions: int
    prefill_tokens: int
    hit_tokens: int
    preemptions: int
    hung_s: float
    held_turns: int = 0  # turns that became ready while their session was hung
    held_p99_s: float = 0.0  # their wait for the continue, 99th percentile
    held_max_s: float = 0.0
    tier_hit_tokens: int = 0  # of hit_tokens: loaded back from the offload tier
    ttft_s: list[float] = field(default_factory=list)  # each turn's, from ready to its first token

    def ttft(self, quantile: float) -> float:
        return percentile(self.ttft_s, quantile)

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.sim_s


class AgentSimulation:
    def __init__(
        self,
        config: Config,
        workload: AgentWorkload,
        cost: CostModel,
        engines_per_device: int = 1,
        tier_tokens: int = 0,
        tier_copy_s_per_token: float = 0.0,
    ) -> None:
        if not config.env.enable:
            raise ValueError("the agent workload runs sessions: set env.enable=true (the agentic preset does)")
        if engines_per_device < 1:
            raise ValueError(f"engines_per_device={engines_per_device}: at least 1")
        self.config, self.workload = config, workload
        self.clock = EventQueue()
        self.tools = SyntheticTools(workload, lambda: self.clock.now, on_due=self._tools_due)
        self.source = AgentSource(workload, self.tools)
        self.router = RouterFlow(config, record_decisions=False)
        self.session = AgentSessions(config, self.tools, workload)
        self.counts = {"turns": 0, "sessions": 0}
        self.turn_clock = TurnClock()
        self.bus = LocalBus(tap=self._tap)
        interval = config.psrl.status_collection.engine_sync_interval_in_ms / 1000
        self.fleet = Fleet(self.clock, self.bus, interval)
        self.bus.attach("coordinator", self.source)
        self.bus.attach("router", self.router, RouterFlow.BUS_KINDS)
        self.bus.attach("session", self.session, AgentSessions.BUS_KINDS)
        shape = replace(
            engine_shape(config),
            tier_tokens=tier_tokens,
            tier_copy_s_per_token=tier_copy_s_per_token,
        )
        devices: dict[int, SharedDevice] = {}
        for index in range(config.topology.n_rollout_instances):
            device = devices.setdefault(index // engines_per_device, SharedDevice()) if engines_per_device > 1 else None
            engine = ModelledEngine(f"rollout-{index}", cost, shape, self.clock, self.fleet, version=0, device=device)
            engine.first_token_listener = self.turn_clock.tokens
            self.fleet.add(ModelledInstance(engine, index, PullModel((0.0,))))
        self.fleet.spread_phases()
        self._is_route_due = False

    def _tap(self, sender: str, effect: Effect, now: float) -> None:
        message = effect.message if isinstance(effect, Send) else None
        if isinstance(message, GenerateRequest) and sender == "coordinator":
            self.turn_clock.became_ready(message.request_id, now)
        elif isinstance(message, TurnDone):
            self.counts["turns"] += 1
        elif isinstance(message, SessionEnd) and not message.error:
            self.counts["sessions"] += 1

    def run(self, budget_s: float) -> AgentSimOutcome:
        self.bus.post("router", self.router.start(0.0), 0.0)
        for engine in self.fleet.engines.values():
            self.fleet.report(engine, 0.0)
        for owner, flow in (("router", self.router), ("session", self.session)):
            for timer in flow.timers():
                self._every(owner, timer, 0.0)
        self._open(0.0)
        while self.clock.run_next() and self.clock.now < budget_s:
            self._deliver(self.clock.now)
        engines = self.fleet.engines.values()
        return AgentSimOutcome(
            sim_s=budget_s,
            turns=self.counts["turns"],
            sessions=self.counts["sessions"],
            prefill_tokens=sum(e.counters.num_prefill_tokens for e in engines),
            hit_tokens=sum(e.counters.num_prefix_hit_tokens for e in engines),
            preemptions=sum(e.counters.num_preemptions for e in engines),
            hung_s=self.session.num_hung_s,
            held_turns=len(self.session.held_waits),
            held_p99_s=percentile(self.session.held_waits, 0.99),
            held_max_s=max(self.session.held_waits, default=0.0),
            tier_hit_tokens=sum(e.prefix_cache.num_tier_hit_tokens for e in engines if e.prefix_cache is not None),
            ttft_s=list(self.turn_clock.ttft_s),
        )

    def _open(self, now: float) -> None:
        """The source's ramp: it opens sessions as time allows, until all are open."""
        self.bus.post("coordinator", self.source.tick(now), now)
        self._deliver(now)
        if now < self.workload.ramp_s:
            self.clock.at(now + SOURCE_TICK_S, self._open)

    def _tools_due(self, due: float) -> None:
        self.clock.at(due, self._tools_answer)

    def _tools_answer(self, now: float) -> None:
        for reply in self.tools.take(now):
            if not reply.done:
                self.turn_clock.became_ready(reply.request_id, now)
            self.bus.post("session", self.session.handle(reply, now), now)
        self._deliver(now)

    def _deliver(self, now: float) -> None:
        if "router" in self.bus.deliver(now) and self.router.has_work and not self._is_route_due:
            self._is_route_due = True
            self.clock.at(now, self._route)

    def _route(self, now: float) -> None:
        self._is_route_due = False
        self.bus.post("router", self.router.route(now), now)
        self._deliver(now)

    def _every(self, owner: str, timer: Timer, now: float) -> None:
        self.clock.at(now + timer.interval_s, lambda t: self._fire(owner, timer, t))

    def _fire(self, owner: str, timer: Timer, now: float) -> None:
        self.bus.post(owner, timer.callback(now), now)
        self._deliver(now)
        self._every(owner, timer, now)
