"""What the coordinator knows when it decides: instances, the PS version, router facts.

Every input a sync, migration or session decision reads is in these structs, so a tick's
decision is a pure function of one ``CoordinationInputs`` and can be replayed from the log.
"""

from __future__ import annotations

import math

import msgspec

from psrl.routing.instance import InstanceSnapshot
from psrl.routing.servable import ServableCounts

LOAD_INDICATORS = ("request_num", "throughput", "kv_cache")


class InstanceState(msgspec.Struct, frozen=True, gc=False):
    """One rollout instance as the coordinator sees it."""

    instance_id: str
    version: int  # version after sync (advertised to the router)
    is_syncing: bool = False
    stale_report_version: int = -1  # reports taken at a model version <= this predate the last sync
    snapshot: InstanceSnapshot | None = None
    last_pull_s: float | None = None  # duration of its last weight pull, when measured

    @property
    def has_fresh_report(self) -> bool:
        snap = self.snapshot
        return snap is not None and snap.model_version > self.stale_report_version

    @property
    def num_active(self) -> int:
        """Requests running or waiting in its engine (0 without a report)."""
        snap = self.snapshot
        return snap.num_running + snap.num_waiting if snap else 0


class RouterFacts(msgspec.Struct, frozen=True, gc=False):
    """What the router reports for a tick: queued work servable per version."""

    servable: dict[int, ServableCounts] = {}
    is_selecting: bool = False  # a routing decision is half-way (never true for a single-threaded core)

    def servable_at(self, version: int) -> ServableCounts:
        return self.servable.get(version) or ServableCounts(version, 0, 0)


class CoordinationInputs(msgspec.Struct, frozen=True, gc=False):
    now: float  # seconds, from the tick event
    ps_version: int
    instances: tuple[InstanceState, ...]
    router: RouterFacts = RouterFacts()
    ready_buffers: frozenset[int] = frozenset()
    max_aborted_version: int = -1  # trajectories at versions <= this can no longer land
    mean_version_interval_s: float | None = None  # measured time between PS versions
    mean_prompt_tokens: float = 0.0  # of recent trajectories
    mean_response_tokens: float = 0.0  # of recent trajectories (seeded by the caller before any finish)


def load_indicator(snapshot: InstanceSnapshot | None, indicator: str) -> float:
    """An instance's load by ``indicator``: request count, decode tokens/s, or KV usage fraction."""
    if snapshot is None:
        return 0.0
    if indicator == "request_num":
        return float(snapshot.num_running + snapshot.num_waiting)
    if indicator == "throughput":
        return snapshot.throughput
    if indicator == "kv_cache":
        return snapshot.kv_usage
    raise ValueError(f"unknown load indicator {indicator!r} (expected one of {LOAD_INDICATORS})")


def safe_ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, with 0 when there is nothing to compare and inf over an idle denominator."""
    if numerator <= 0:
        return 0.0
    if denominator <= 0:
        return math.inf
    return numerator / denominator
