"""Builders for coordination tests: instances with status reports and tick inputs."""

from __future__ import annotations

from typing import Any

from psrl.config.coordination import SyncAndMigStrategy
from psrl.coordination.state import CoordinationInputs, InstanceState, RouterFacts
from psrl.engine_cost.model import CostModel
from psrl.routing import InstanceSnapshot, ServableCounts

COST = CostModel(3.35e-8, 0.0064, 1.231e-4, 0.0028)  # kink at n* = 52


def inst(
    instance_id: str,
    version: int = 0,
    *,
    running: int = 0,
    waiting: int = 0,
    kv_tokens: int = 0,
    capacity: int = 1_000_000,
    kv_usage: float = 0.0,
    throughput: float = 0.0,
    response_tokens: int = 0,
    report: bool = True,
    report_version: int | None = None,
    **fields: Any,
) -> InstanceState:
    snapshot = None
    if report:
        snapshot = InstanceSnapshot(
            instance_id, 1, version if report_version is None else report_version, running, waiting, kv_tokens,
            capacity, kv_usage, kv_tokens, response_tokens, throughput, 0,
        )  # fmt: skip
    return InstanceState(instance_id, version, snapshot=snapshot, **fields)


def inputs(
    ps_version: int, *instances: InstanceState, servable: dict[int, tuple[int, int]] | None = None, **fields: Any
):
    facts = RouterFacts({v: ServableCounts(v, a, b) for v, (a, b) in (servable or {}).items()})
    return CoordinationInputs(0.0, ps_version, tuple(instances), facts, **fields)


def strategy(method: str = "status_based", **sections: dict[str, Any]) -> SyncAndMigStrategy:
    return SyncAndMigStrategy(method=method, **sections)
