"""Helpers for routing tests: a small explicit staleness ledger and core builders.

``WindowLedger`` is an in-test implementation of the ``StalenessLedger`` protocol (the real
ledger lives in psrl.staleness): buffers hold ``entries`` prompt groups, a trajectory of version
``v`` may land in buffers ``[v, v + staleness]`` from the first unconsumed one, a new group takes
the latest legal buffer with room, and siblings join their group's entry while ``v + staleness``
reaches it.
"""

from __future__ import annotations

import math
from typing import Any

from psrl.config.coordination import RoutingStrategy
from psrl.engine_cost.model import CostModel
from psrl.routing import InstanceSnapshot, RouterCore, RoutingRequest, make_policy
from psrl.routing.selector import select

# Shaped like a 7B model on one GPU: the floor k2 meets k3 * n at n* = 52.
COST = CostModel(3.35e-8, 0.0064, 1.231e-4, 0.0028)


class WindowLedger:
    def __init__(self, staleness: int = 1, entries: int = 1000, first_buffer: int = 0) -> None:
        self.staleness = staleness
        self.entries = entries
        self.first_buffer = first_buffer
        self.groups: dict[int, int] = {}  # prompt -> buffer of its entry
        self.counts: dict[int, int] = {}
        self.reserved: list[tuple[int, int, int, str]] = []  # (prompt, child, version, instance)

    def _new_entry_buffer(self, version: int) -> int | None:
        legal = range(max(version, self.first_buffer), version + self.staleness + 1)
        free = [b for b in legal if self.counts.get(b, 0) < self.entries]
        return max(free) if free else None

    def can_reserve_without_new_entry(self, prompt_id: int, version: int) -> bool:
        buffer = self.groups.get(prompt_id)
        return buffer is not None and version + self.staleness >= buffer

    def can_reserve(self, prompt_id: int, version: int) -> bool:
        if prompt_id in self.groups:
            return self.can_reserve_without_new_entry(prompt_id, version)
        return self._new_entry_buffer(version) is not None

    def reserve_indicator(self, prompt_id: int, version: int) -> float:
        if self.can_reserve_without_new_entry(prompt_id, version):
            return -math.inf
        buffer = None if prompt_id in self.groups else self._new_entry_buffer(version)
        return math.inf if buffer is None else -float(buffer)

    def has_group(self, prompt_id: int) -> bool:
        return prompt_id in self.groups

    def room_signature(self) -> tuple[int, frozenset[int]]:
        return self.first_buffer, frozenset(b for b, n in self.counts.items() if n >= self.entries)

    def reserve(self, prompt_id: int, child: int, version: int, instance: str) -> int:
        self.reserved.append((prompt_id, child, version, instance))
        if prompt_id in self.groups:
            if not self.can_reserve_without_new_entry(prompt_id, version):
                raise ValueError(f"prompt {prompt_id} cannot join at version {version}")
            return self.groups[prompt_id]
        buffer = self._new_entry_buffer(version)
        if buffer is None:
            raise ValueError(f"no buffer for prompt {prompt_id} at version {version}")
        self.groups[prompt_id] = buffer
        self.counts[buffer] = self.counts.get(buffer, 0) + 1
        return buffer


def make_core(
    method: str = "request_num_balance",
    *,
    versions: tuple[int, ...] = (0, 0, 0, 0),
    ledger: Any = None,
    capacity: int = 100_000,
    offload_tier: Any = None,
    **settings: Any,
) -> RouterCore:
    """A core with instances i0, i1, ... at the given versions."""
    config = RoutingStrategy(method=method, **settings)
    core = RouterCore(config, ledger or WindowLedger(), make_policy(config, COST), offload_tier=offload_tier)
    for index, version in enumerate(versions):
        core.add_instance(f"i{index}", version, capacity)
    return core


def request(request_id: int, prompt_id: int | None = None, **fields: Any) -> RoutingRequest:
    prompt = request_id if prompt_id is None else prompt_id
    fields.setdefault("num_prompt_tokens", 100)
    return RoutingRequest(request_id, prompt, **fields)


def snapshot(instance_id: str, seq: int, **fields: Any) -> InstanceSnapshot:
    values: dict[str, Any] = {
        "model_version": 0,
        "num_running": 0,
        "num_waiting": 0,
        "kv_tokens": 0,
        "kv_capacity_tokens": 100_000,
        "kv_usage": 0.0,
        "budget_kv_tokens": 0,
        "response_tokens": 0,
        "throughput": 0.0,
        "last_dispatch_seq": -1,
    }
    values.update(fields)
    return InstanceSnapshot(instance_id, seq, **values)


def peek(core: RouterCore, r: RoutingRequest) -> tuple[str | None, str]:
    """Where selection would send ``r`` now, and why, without committing anything."""
    inputs = core.gather_inputs(r)
    selection = select(inputs, core.selection, core.policy)
    if selection.choice is None:
        return None, selection.reason
    return inputs.candidates[selection.choice.index].instance_id, selection.choice.detail


def route(core: RouterCore, *requests: RoutingRequest, now: float = 0.0) -> dict[int, str | None]:
    """Submit and dispatch; request id -> instance (None while it stays queued)."""
    for r in requests:
        core.submit(r)
    result = core.dispatch(now)
    placed: dict[int, str | None] = {r.request_id: None for r in requests}
    placed.update({d.request_id: d.instance_id for d in result.routed})
    return placed
