"""The simulated rollout instances: modelled engines and their periodic status reports.

A real instance reports every ``engine_sync_interval_in_ms``. Here an instance reports at its
next slot of that period after it changed (each instance has its own phase), and not at all
while nothing changes, so a quiet fleet costs no events; right after loading weights it reports
at once, as the rollout actor does. Reports go to the router and the coordinator alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from psrl.routing.instance import InstanceSnapshot
from psrl.sim.engine_model import ModelledEngine, StayResult
from psrl.sim.events import EventQueue

SnapshotSink = Callable[[InstanceSnapshot, float], None]


class Fleet:
    def __init__(self, clock: EventQueue, report_interval_s: float) -> None:
        self.clock = clock
        self.report_interval_s = report_interval_s
        self.engines: dict[str, ModelledEngine] = {}
        self._phase: dict[str, float] = {}
        self._index: dict[str, int] = {}
        self._report_due: set[str] = set()
        self.on_result_sink: Callable[[StayResult, float], None] | None = None
        self.on_loaded_sink: Callable[[str, int, float, float], None] | None = None
        self.snapshot_sinks: list[SnapshotSink] = []

    def add(self, engine: ModelledEngine) -> None:
        self._index[engine.instance_id] = len(self.engines)
        self.engines[engine.instance_id] = engine
        self._phase[engine.instance_id] = 0.0

    def index(self, instance_id: str) -> int:
        return self._index[instance_id]

    def spread_phases(self) -> None:
        """Give every instance its own report phase within the period (instances start unsynchronised)."""
        count = len(self.engines)
        for index, instance in enumerate(self.engines):
            self._phase[instance] = self.report_interval_s * index / count

    # EngineSink ------------------------------------------------------------------------------

    def on_result(self, engine: ModelledEngine, result: StayResult, now: float) -> None:
        if self.on_result_sink is None:
            raise RuntimeError("the fleet has no result sink")
        self.on_result_sink(result, now)

    def on_loaded(self, engine: ModelledEngine, version: int, pull_s: float, now: float) -> None:
        if self.on_loaded_sink is None:
            raise RuntimeError("the fleet has no loaded sink")
        self.on_loaded_sink(engine.instance_id, version, pull_s, now)
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
        snapshot = engine.snapshot(now)
        for sink in self.snapshot_sinks:
            sink(snapshot, now)

    # summaries -------------------------------------------------------------------------------

    def total(self, name: str) -> float:
        return float(sum(getattr(engine.counters, name) for engine in self.engines.values()))
