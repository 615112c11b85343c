"""The whole algorithm in one process: the real flows, engines and trainer core over in-memory queues.

    generate   instances step their engines; tokens and results go to the router
    reward     finished trajectories reach the coordinator, which scores them
    occupy     complete groups occupy staleness slots (the router's ledger)
    consume    full buffers go to the trainer chunk by chunk, and are consumed
    train      the trainer core steps on each buffer
    push       the new version goes to the parameter server (here: a dict of versions)
    sync       the coordinator's sync strategy tells instances to load it

With ``topology.colocate`` the coordinator's ``tms.pause`` / ``tms.resume`` reach the instances and the
trainer as they would over the control channel; each side's memory is ``psrl.tms`` as configured, or
the regions of the backend ``memory_backend(actor name)`` gives (one torch-memory-saver serves a whole
process: on a GPU, run one instance).

No sockets, threads or processes: a virtual clock advances ``tick_s`` per round, so a run is
deterministic and fast tests can train whole steps. The simulator is the same loop with modelled
engines, a modelled trainer and an event-driven clock (``psrl.sim``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from bus.messages import Metrics, RunFinished, StalenessCertificate, TrainerProgress, WeightsPublished
from bus.schema import Message
from psrl.config import Config
from psrl.engine import Engine, EngineArgs
from psrl.envs.host import EnvHost, InProcessEnv
from psrl.evaluation.planner import EvalPlanner
from psrl.flows.base import Flow
from psrl.flows.coordinator import CoordinatorFlow
from psrl.flows.effects import Effect, Publish, PushWeights, Send
from psrl.flows.instance import InstanceFlow
from psrl.flows.local import LocalBus
from psrl.flows.prompts import TaskPrompts
from psrl.flows.router import RouterFlow
from psrl.flows.session import SessionFlow
from psrl.flows.trainer import TrainerFlow
from psrl.ps import PullFailedError
from psrl.ps.supply import Fetched
from psrl.tms import ROLLOUT, TRAINER, MemoryBackend, SideMemory, managed_regions
from psrl.tms.backend import side_memory
from psrl.trainer import TrainerCore


class MemoryWeights:
    """The parameter server in memory: every pushed version, whole."""

    def __init__(self) -> None:
        self.versions: dict[int, list[tuple[str, torch.Tensor]]] = {}

    def store(self, version: int, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.versions[version] = [(name, tensor.detach().clone()) for name, tensor in weights]

    def prefetch(self, version: int) -> None:
        """Nothing to do ahead: a fetch is a dictionary look-up."""

    def is_arriving(self, version: int) -> bool:
        return False

    def fetch(self, version: int) -> Fetched:
        if version not in self.versions:
            raise PullFailedError(version, "not pushed")
        return Fetched(version, self.versions[version], prefetched=False, pull_ms=0.0)


@dataclass
class RunRecord:
    """What an in-process run reports: every Metrics and TrainerProgress event, and how it ended."""

    metrics: list[Metrics] = field(default_factory=list)
    progress: list[TrainerProgress] = field(default_factory=list)
    finished: RunFinished | None = None
    certificates: list[StalenessCertificate] = field(default_factory=list)

    def handle(self, message: Message, now: float) -> list[Effect]:
        if isinstance(message, Metrics):
            self.metrics.append(message)
        elif isinstance(message, StalenessCertificate):
            self.certificates.append(message)
        elif isinstance(message, TrainerProgress):
            self.progress.append(message)
        elif isinstance(message, RunFinished):
            self.finished = message
        return []

    def undeliverable(self, send: Send, now: float) -> list[Effect]:
        return []


class InProcessRun:
    def __init__(
        self,
        config: Config,
        *,
        tick_s: float = 0.01,
        memory_backend: Callable[[str], MemoryBackend] | None = None,
    ) -> None:
        self.config, self.tick_s, self.now = config, tick_s, 0.0
        self.memory_backend = memory_backend
        task = TaskPrompts(config)
        planner = EvalPlanner(config, task.held_out(config)) if config.trainer.eval_interval else None
        self.coordinator = CoordinatorFlow(config, task, task, evaluation=planner)
        self.router = RouterFlow(config)
        self.weights = MemoryWeights()
        self.instances = [
            InstanceFlow(
                f"rollout-{i}",
                config,
                Engine(EngineArgs.from_config(config), memory=self._memory(f"rollout-{i}", ROLLOUT)),
                self.weights,
                clock=lambda: self.now,
            )
            for i in range(config.topology.n_rollout_instances)
        ]
        self.trainer = TrainerFlow(config, TrainerCore(config, memory=self._memory("trainer-0", TRAINER)))
        self.env: InProcessEnv | None = None
        self.session: SessionFlow | None = None
        if config.env.enable:  # multi-turn sessions: the session scheduler with in-process environments
            self.env = InProcessEnv(EnvHost(config.task.name, config.task.seed, task.tokenizer.name_or_path))
            self.session = SessionFlow(config, self.env)
        self.record = RunRecord()
        self.bus = LocalBus()
        self.bus.on_other = self._push
        self._wire()
        self._timers = [(name, timer, timer.interval_s) for name, flow in self._flows() for timer in flow.timers()]

    def _memory(self, actor: str, side: str) -> SideMemory:
        if self.memory_backend is None:
            return side_memory(self.config, side)
        tms = self.config.psrl.tms
        regions = managed_regions(tms.range, side, enable_cuda_graph=tms.enable_cuda_graph)
        return SideMemory(side, regions, self.memory_backend(actor))

    def _flows(self) -> list[tuple[str, Flow]]:
        instances: list[tuple[str, Flow]] = [(i.name, i) for i in self.instances]
        sessions: list[tuple[str, Flow]] = [] if self.session is None else [("session", self.session)]
        return [
            ("coordinator", self.coordinator),
            ("router", self.router),
            *instances,
            ("trainer-0", self.trainer),
            *sessions,
        ]

    def _wire(self) -> None:
        """Each flow gets what is sent to it by name and subscribes to its bus kinds, as its actor does."""
        for name, flow in self._flows():
            self.bus.attach(name, flow, flow.BUS_KINDS)
        self.bus.attach("record", self.record, [Metrics, TrainerProgress, RunFinished, StalenessCertificate])

    def start(self) -> None:
        """The flows' first effects: the coordinator's first requests, the router's and instances' status."""
        self.bus.post("coordinator", self.coordinator.start(self.now), self.now)
        self.bus.post("router", self.router.start(self.now), self.now)
        for instance in self.instances:
            self.bus.post(instance.name, instance.start(self.now), self.now)

    def run(self, max_rounds: int = 1_000_000) -> RunRecord:
        """Run until the coordinator ends the run (``trainer.total_steps`` versions)."""
        self.start()
        for _ in range(max_rounds):
            if self.record.finished is not None:
                return self.record
            self.round()
        raise RuntimeError(f"the run did not finish in {max_rounds} rounds (at {self.now:.1f} s)")

    def round(self) -> None:
        """Deliver, route, generate (one engine step per instance), fire due timers; then time moves on."""
        self.bus.deliver(self.now)
        self.bus.post("router", self.router.route(self.now), self.now)
        for instance in self.instances:
            self.bus.post(instance.name, instance.step(self.now), self.now)
        self.bus.deliver(self.now)
        if self.session is not None and self.env is not None:
            for reply in self.env.take():  # environment steps answered this round
                self.bus.post("session", self.session.handle(reply, self.now), self.now)
            self.bus.deliver(self.now)
        self._fire_timers()
        self.now += self.tick_s

    def _fire_timers(self) -> None:
        for index, (name, timer, due) in enumerate(self._timers):
            if self.now >= due:
                self.bus.post(name, timer.callback(self.now), self.now)
                self._timers[index] = (name, timer, self.now + timer.interval_s)

    def _push(self, sender: str, effect: Effect, now: float) -> None:
        """The trainer's new version goes to the parameter server, which publishes it."""
        if not isinstance(effect, PushWeights):
            raise TypeError(f"the in-process run cannot perform {type(effect).__name__}")
        self.weights.store(effect.version, list(self.trainer.core.named_weights()))
        published = WeightsPublished(version=effect.version, manifest_digest="", num_shards=1)
        progress = TrainerProgress(
            step=effect.step, version=effect.version, num_samples=effect.num_samples, step_s=now - effect.started_s
        )
        self.bus.post(
            sender,
            [Publish(published, model_version=effect.version), Publish(progress, model_version=effect.version)],
            now,
        )
