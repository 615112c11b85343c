"""Migration: even out load by interrupting a busy instance so the router re-places its requests.

An instance is *starved* when it has a fresh report, an empty engine waiting queue, a version
whose trajectories can still land, and no queued request it could serve at its version. For a
starved ``s`` and each other instance ``i`` at a version ``<= v(s)`` (so whatever ``i`` runs
may continue on ``s``), ``ratio = indicator(i) / indicator(s)``: 0 when ``i`` has no load, inf
when ``s`` has none. Candidates need ``ratio > threshold`` and ``stop_indicator(i) >=
stop_threshold`` (too little load is not worth moving); the largest ratio wins, ties to the
earlier instance. One instance migrates per tick.

``scope=all`` aborts every request of that instance (they loop back and are re-routed);
``scope=excess`` aborts only the share that evens the pair: a fraction
``(ind(i) - ind(s)) / (2 ind(i))`` of its requests, at least one.
"""

from __future__ import annotations

import math

import msgspec

from psrl.config.coordination import MigrationStrategy
from psrl.coordination.state import CoordinationInputs, InstanceState, load_indicator, safe_ratio


class MigrationDecision(msgspec.Struct, frozen=True, gc=False):
    source_id: str  # instance whose requests are aborted and re-routed
    starved_id: str  # the idle instance that triggered it
    ratio: float
    source_load: float
    num_to_move: int | None  # None: all of the source's requests


def starved_instances(inputs: CoordinationInputs) -> list[InstanceState]:
    return [inst for inst in inputs.instances if _is_starved(inst, inputs)]


def _is_starved(inst: InstanceState, inputs: CoordinationInputs) -> bool:
    snap = inst.snapshot
    return (
        snap is not None
        and not inst.is_syncing
        and inst.has_fresh_report
        and snap.num_waiting == 0
        and inst.version > inputs.max_aborted_version
        and inputs.router.servable_at(inst.version).total == 0
    )


def decide_migration(inputs: CoordinationInputs, settings: MigrationStrategy) -> MigrationDecision | None:
    if not settings.enable or settings.threshold is None:
        return None
    stop_threshold = settings.stop_threshold if settings.stop_threshold is not None else -math.inf
    best: tuple[float, InstanceState, InstanceState] | None = None
    for starved in starved_instances(inputs):
        starved_load = load_indicator(starved.snapshot, settings.indicator)
        for inst in inputs.instances:
            if inst is starved or inst.is_syncing or not inst.has_fresh_report or inst.version > starved.version:
                continue
            ratio = safe_ratio(load_indicator(inst.snapshot, settings.indicator), starved_load)
            if (
                ratio <= max(settings.threshold, 0.0)
                or load_indicator(inst.snapshot, settings.stop_indicator) < stop_threshold
            ):
                continue
            if best is None or ratio > best[0]:
                best = (ratio, inst, starved)
    if best is None:
        return None
    ratio, source, starved = best
    source_load = load_indicator(source.snapshot, settings.indicator)
    return MigrationDecision(
        source.instance_id,
        starved.instance_id,
        ratio,
        source_load,
        _num_to_move(settings, source, source_load, starved),
    )


def _num_to_move(
    settings: MigrationStrategy, source: InstanceState, source_load: float, starved: InstanceState
) -> int | None:
    if settings.scope == "all":
        return None
    fraction = (source_load - load_indicator(starved.snapshot, settings.indicator)) / (2 * source_load)
    return max(1, math.floor(source.num_active * fraction))
