"""The simulated rollout instances: modelled engines behind the messages a real instance takes and sends.

Each instance is a node on the simulation's ``LocalBus``: it takes ``GenerateRequest`` and
``Abort`` from the router and ``SyncCommand`` / ``MigrateCommand`` from the coordinator, hands
them to its ``ModelledEngine``, and answers as the rollout actor does: a ``GenerateResult`` when
a request leaves the engine (its tokens are placeholders; their weight versions are exact), a
``WeightsLoaded`` after a pull, and ``InstanceStatus`` reports to the router (which the bus
delivers to the coordinator too, as a real instance's link publishes what it sends).

A real instance reports every ``engine_sync_interval_in_ms``. Here an instance reports at its
next slot of that period after it changed (each instance has its own phase), and not at all
while nothing changes, so a quiet fleet costs no events; right after loading weights it reports
at once, as the rollout actor does.
"""

from __future__ import annotations

import math

import numpy as np

from bus.messages import (
    Abort,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    InstanceStatus,
    MigrateCommand,
    SyncCommand,
    WeightsLoaded,
)
from bus.schema import Message
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.local import LocalBus
from psrl.routing.instance import InstanceSnapshot
from psrl.sim.engine_model import FINISHED, EngineRequest, ModelledEngine, StayResult
from psrl.sim.events import EventQueue
from psrl.sim.models import PullModel

ROUTER = "router"
_NO_IDS = np.zeros(0, np.int32)


class ModelledInstance:
    """One instance: what the router and coordinator send it, turned into engine commands."""

    BUS_KINDS = (SyncCommand, MigrateCommand)

    def __init__(self, engine: ModelledEngine, index: int, pull: PullModel) -> None:
        self.engine = engine
        self.name = engine.instance_id
        self.index = index
        self.pull = pull
        self.requests: dict[int, tuple[int, np.ndarray]] = {}  # request -> (prompt id, versions of prior tokens)

    def handle(self, message: Message, now: float) -> list[Effect]:
        if isinstance(message, GenerateRequest):
            self._add(message, now)
        elif isinstance(message, Abort):
            self.engine.abort(now, message.request_ids, message.reason or "requested")
        elif isinstance(message, SyncCommand) and self.name in message.instances:
            pull_s = self.pull.pull_time(self.index, message.version)
            self.engine.sync(now, message.version, pull_s, abort_running=message.abort_running)
        elif isinstance(message, MigrateCommand) and message.source == self.name:
            self.engine.migrate(now, message.num_requests)
        return []

    def undeliverable(self, send: Send, now: float) -> list[Effect]:
        return []

    def _add(self, request: GenerateRequest, now: float) -> None:
        prior = _NO_IDS if request.generated_versions is None else request.generated_versions
        self.requests[request.request_id] = (request.prompt_id, prior)
        self.engine.add(
            now,
            EngineRequest(
                request.request_id,
                len(request.prompt_token_ids),
                len(prior),
                request.sampling.max_tokens,
                request.dispatch_seq,
            ),
        )

    def result(self, stay: StayResult) -> GenerateResult:
        """What the engine's instance sends the router when a request leaves it."""
        prompt_id, prior = self.requests.pop(stay.request_id, (-1, _NO_IDS))
        here = np.full(stay.num_generated_here, stay.version, np.int32)
        versions = np.concatenate([prior[: stay.num_generated - stay.num_generated_here], here])
        finish = FinishReason.LENGTH if stay.reason == FINISHED else FinishReason.ABORT
        return GenerateResult(
            request_id=stay.request_id,
            prompt_id=prompt_id,
            token_ids=np.zeros(len(versions), np.int32),
            logprobs=np.zeros(len(versions), np.float32),
            versions=versions,
            finish_reason=finish,
            instance=self.name,
            error=stay.reason,
        )

    def status(self, snapshot: InstanceSnapshot) -> InstanceStatus:
        block = self.engine.shape.block_size
        total = snapshot.kv_capacity_tokens // block
        return InstanceStatus(
            instance=self.name,
            weight_version=snapshot.model_version,
            num_running=snapshot.num_running,
            num_waiting=snapshot.num_waiting,
            kv_blocks_used=min(total, -(-snapshot.kv_tokens // block)),
            kv_blocks_total=total,
            tokens_per_s=snapshot.throughput,
            num_tokens_running=snapshot.kv_tokens,
            kv_capacity_tokens=snapshot.kv_capacity_tokens,
            budget_kv_tokens=snapshot.budget_kv_tokens,
            num_response_tokens=snapshot.response_tokens,
            last_dispatch_seq=snapshot.last_dispatch_seq,
            report_seq=snapshot.seq,
        )


class Fleet:
    """Every modelled engine's sink: results, loads and reports go out on the bus from their instance."""

    def __init__(self, clock: EventQueue, bus: LocalBus, report_interval_s: float) -> None:
        self.clock = clock
        self.bus = bus
        self.report_interval_s = report_interval_s
        self.instances: dict[str, ModelledInstance] = {}
        self._phase: dict[str, float] = {}
        self._report_due: set[str] = set()

    @property
    def engines(self) -> dict[str, ModelledEngine]:
        return {name: instance.engine for name, instance in self.instances.items()}

    def add(self, instance: ModelledInstance) -> None:
        self.instances[instance.name] = instance
        self._phase[instance.name] = 0.0
        self.bus.attach(instance.name, instance, instance.BUS_KINDS)

    def spread_phases(self) -> None:
        """Give every instance its own report phase within the period (instances start unsynchronised)."""
        count = len(self.instances)
        for index, name in enumerate(self.instances):
            self._phase[name] = self.report_interval_s * index / count

    # EngineSink ------------------------------------------------------------------------------

    def on_result(self, engine: ModelledEngine, result: StayResult, now: float) -> None:
        instance = self.instances[engine.instance_id]
        message = instance.result(result)
        send = Send(
            ROUTER, message, request_id=result.request_id, prompt_id=message.prompt_id, model_version=result.version
        )
        self.bus.post(instance.name, [send], now)

    def on_loaded(self, engine: ModelledEngine, version: int, pull_s: float, now: float) -> None:
        loaded = WeightsLoaded(
            instance=engine.instance_id, version=version, load_ms=pull_s * 1000, pull_ms=pull_s * 1000
        )
        self.bus.post(engine.instance_id, [Publish(loaded, model_version=version)], now)
        self.report(engine, now)

    def on_changed(self, engine: ModelledEngine, now: float) -> None:
        instance = engine.instance_id
        if instance in self._report_due:
            return
        self._report_due.add(instance)
        phase, period = self._phase[instance], self.report_interval_s
        slot = phase + math.ceil((now - phase) / period) * period
        self.clock.at(slot, lambda t: self._on_slot(engine, t))

    def _on_slot(self, engine: ModelledEngine, now: float) -> None:
        self._report_due.discard(engine.instance_id)
        self.report(engine, now)

    def report(self, engine: ModelledEngine, now: float) -> None:
        if engine.is_pulling:  # the instance's actor is busy pulling: no report until it has loaded
            return
        status = self.instances[engine.instance_id].status(engine.snapshot(now))
        # sent to the router; the coordinator gets it too, as a link publishes what it sends
        self.bus.post(engine.instance_id, [Send(ROUTER, status, model_version=status.weight_version)], now)

    # summaries -------------------------------------------------------------------------------

    def total(self, name: str) -> float:
        return float(sum(getattr(instance.engine.counters, name) for instance in self.instances.values()))
