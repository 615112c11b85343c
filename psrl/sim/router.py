"""The simulated router: ``actors/router.py``'s flow around the real ``RouterCore`` and ``StalenessLedger``.

Every decision is the real code's: worker selection and the routing policy (``RouterCore``,
``make_policy``), Reserve / finish / Occupy / Consume and the aborts (``StalenessLedger``), and the
preemption rule inside the modelled engines. What this module adds is only the wiring the actor
does: it keeps each trajectory's V_traj and its tokens per version, loops interrupted requests
back (partial rollout) or restarts them (without), aborts surplus and stale children, and tells
the coordinator what the ledger decided. Dispatch passes run as their own events, after the
event that made them possible, as the actor's loop routes after it has handled its messages.
"""

from __future__ import annotations

from typing import Protocol

from psrl.config import Config
from psrl.config.coordination import RoutingStrategy
from psrl.routing.core import RouterCore
from psrl.routing.cost_model import CostModel
from psrl.routing.instance import InstanceSnapshot
from psrl.routing.policies import make_policy
from psrl.routing.request import RoutingRequest
from psrl.routing.trajectories import INTERRUPTIONS
from psrl.sim.engine_model import FINISHED, EngineRequest, ModelledEngine, StayResult
from psrl.sim.events import EventQueue
from psrl.sim.stats import SimStats
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.types import AbortReason, ConsumedBuffer, FinishVerdict, GroupAborted, LedgerError, LedgerSizes

_NOT_REFILLED = ("surplus", "stale", "group")  # abort reasons whose group needs no replacement


class SimTrajectory:
    """One request's life: V_traj from its first routing, and its tokens as (version, count) runs."""

    __slots__ = ("abort_reason", "child", "max_tokens", "num_generated", "num_prompt_tokens", "prompt_id",
                 "request_id", "segments", "v_traj")  # fmt: skip

    def __init__(self, request_id: int, prompt_id: int, child: int, num_prompt_tokens: int, max_tokens: int) -> None:
        self.request_id = request_id
        self.prompt_id = prompt_id
        self.child = child
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.v_traj = -1
        self.num_generated = 0
        self.segments: list[tuple[int, int]] = []
        self.abort_reason: str | None = None


class CoordinatorPort(Protocol):
    def on_finished(self, traj: SimTrajectory, now: float) -> None: ...

    def on_group_complete(self, prompt_id: int, winners: tuple[int, ...], now: float) -> None: ...

    def on_group_drop(self, prompt_id: int, reason: str, now: float) -> None: ...

    def on_occupied(self, prompt_id: int, buffer: int, now: float) -> None: ...

    def on_buffer_ready(self, buffer: int, prompt_ids: list[int], now: float) -> None: ...

    def on_refill(self, prompt_ids: list[int], now: float) -> None: ...


def router_settings(config: Config) -> RoutingStrategy:
    """``routing_strategy`` with the in-flight cap the router actor applies (engine batch size)."""
    routing = config.psrl.rollout_coordination.routing_strategy
    if routing.admission_reject_on_waiting:
        cap, current = config.engine.max_num_seqs, routing.max_concurrent_seqs_per_instance
        routing = routing.model_copy(update={"max_concurrent_seqs_per_instance": min(cap, current or cap)})
    return routing


class SimRouter:
    def __init__(self, config: Config, clock: EventQueue, cost: CostModel | None, stats: SimStats) -> None:
        routing = router_settings(config)
        self.clock = clock
        self.stats = stats
        self.ledger = StalenessLedger(LedgerSizes.from_config(config))
        self.core = RouterCore(routing, self.ledger, make_policy(routing, cost), record_inputs=False)
        self.is_partial_rollout = config.psrl.rollout_coordination.partial_rollout.enable
        self.num_children = config.responses_per_prompt
        self.engines: dict[str, ModelledEngine] = {}
        self.versions: dict[str, int] = {}
        self.syncing: set[str] = set()
        self.live: dict[int, SimTrajectory] = {}
        self.coordinator: CoordinatorPort | None = None
        self._is_dispatch_due = False

    # ------------------------------------------------------------------ instances

    def add_instance(self, engine: ModelledEngine) -> None:
        self.engines[engine.instance_id] = engine
        self.versions[engine.instance_id] = engine.version
        self.core.add_instance(engine.instance_id, engine.version, engine.shape.kv_capacity_tokens)

    def on_snapshot(self, snapshot: InstanceSnapshot, now: float) -> None:
        if self.core.apply_snapshot(snapshot):
            self._dispatch_soon(now)

    def on_sync_command(self, instance_ids: tuple[str, ...], version: int) -> None:
        for instance in instance_ids:
            if self.versions[instance] < version:
                self.syncing.add(instance)
                self.core.set_paused(instance, True)
        self._hold_routing_while_syncing()

    def on_loaded(self, instance: str, version: int, now: float) -> None:
        self.versions[instance] = version
        self.syncing.discard(instance)
        self.core.set_version(instance, version)
        self.core.set_paused(instance, False)
        self.core.set_healthy(instance, True)
        self._hold_routing_while_syncing()
        self._dispatch_soon(now)

    def _hold_routing_while_syncing(self) -> None:
        """As the router actor: no routing while any instance of a sync still loads (work placed then
        would pile onto whichever instance finishes first)."""
        if self.syncing:
            self.core.pause()
        else:
            self.core.resume()

    # ------------------------------------------------------------------ requests

    def submit(self, traj: SimTrajectory, now: float) -> None:
        self.live[traj.request_id] = traj
        self.core.submit(self._routing_request(traj))
        self._dispatch_soon(now)

    def _routing_request(self, traj: SimTrajectory) -> RoutingRequest:
        return RoutingRequest(
            traj.request_id, traj.prompt_id, traj.child, traj.v_traj,
            num_prompt_tokens=traj.num_prompt_tokens, num_response_tokens=traj.num_generated,
        )  # fmt: skip

    def _dispatch_soon(self, now: float) -> None:
        if not self._is_dispatch_due and self.core.num_queued:
            self._is_dispatch_due = True
            self.clock.at(now, self._dispatch)

    def _dispatch(self, now: float) -> None:
        self._is_dispatch_due = False
        result = self.core.dispatch(now)
        if result.routed and not self.stats.num_routing_decisions:
            self.stats.first_dispatch_s = now
        self.stats.num_routing_decisions += len(result.routed)
        for decision in result.routed:
            traj = self.live[decision.request_id]
            traj.v_traj = decision.version_tag
            request = EngineRequest(traj.request_id, traj.num_prompt_tokens, traj.num_generated, traj.max_tokens,
                                    decision.dispatch_seq)  # fmt: skip
            self.engines[decision.instance_id or ""].add(now, request)

    # ------------------------------------------------------------------ results

    def on_result(self, result: StayResult, now: float) -> None:
        traj = self.live.get(result.request_id)
        if traj is None:
            return
        traj.num_generated = result.num_generated
        if result.num_generated_here:
            traj.segments.append((result.version, result.num_generated_here))
        if result.reason == FINISHED:
            self.core.release(traj.request_id)
            self._finished(traj, now)
        elif traj.abort_reason is not None or result.reason not in INTERRUPTIONS:
            traj.abort_reason = traj.abort_reason or result.reason
            self.core.release(traj.request_id)
            self._ended(traj, now)
        else:
            self._interrupted(traj, now)
        self._dispatch_soon(now)

    def _interrupted(self, traj: SimTrajectory, now: float) -> None:
        self.stats.num_loopbacks += 1
        if not self.is_partial_rollout:  # start over from the prompt
            self.stats.num_wasted_tokens += traj.num_generated
            traj.num_generated, traj.segments = 0, []
        self.core.loop_back(traj.request_id, traj.num_generated)

    def _finished(self, traj: SimTrajectory, now: float) -> None:
        outcome = self.ledger.finish_child(traj.prompt_id, traj.child)
        if outcome.verdict in (FinishVerdict.LATE, FinishVerdict.UNKNOWN, FinishVerdict.DUPLICATE):
            self._discard(traj)
            return
        del self.live[traj.request_id]
        coordinator = self._coordinator()
        coordinator.on_finished(traj, now)
        if outcome.verdict is FinishVerdict.GROUP_COMPLETE:
            self._abort_children(traj.prompt_id, [ref.child for ref in outcome.surplus], "surplus", now)
            coordinator.on_group_complete(traj.prompt_id, outcome.winners, now)

    def _ended(self, traj: SimTrajectory, now: float) -> None:
        """A trajectory ended without finishing (aborted on request)."""
        self._discard(traj)
        if traj.abort_reason not in _NOT_REFILLED:
            aborted = self.ledger.abort_child(traj.prompt_id, traj.child, AbortReason.FAILED)
            if aborted is not None:
                self._group_aborted(aborted, now)

    def _discard(self, traj: SimTrajectory) -> None:
        self.live.pop(traj.request_id, None)
        self.stats.num_wasted_tokens += traj.num_generated

    def _coordinator(self) -> CoordinatorPort:
        if self.coordinator is None:
            raise RuntimeError("the simulated router has no coordinator")
        return self.coordinator

    # ------------------------------------------------------------------ ledger commands from the coordinator

    def group_complete(self, prompt_id: int, now: float) -> None:
        coordinator = self._coordinator()
        try:
            outcome = self.ledger.occupy(prompt_id)
        except LedgerError as exc:  # dropped (e.g. stale) in between
            coordinator.on_group_drop(prompt_id, f"gone: {exc}", now)
            return
        if outcome.buffer_id is None:
            coordinator.on_group_drop(prompt_id, "no_room", now)
        else:
            coordinator.on_occupied(prompt_id, outcome.buffer_id, now)
        for aborted in outcome.aborted:
            self._group_aborted(aborted, now)
        if outcome.is_buffer_ready and outcome.buffer_id is not None:
            coordinator.on_buffer_ready(outcome.buffer_id, self.ledger.occupied_groups(outcome.buffer_id), now)
        self.core.notify_ledger_changed()
        self._dispatch_soon(now)

    def consume(self, buffer: int, now: float) -> ConsumedBuffer:
        consumed = self.ledger.consume(buffer)
        self.stats.ledger_staleness.update(consumed.staleness_histogram)
        self.stats.num_ledger_violations += consumed.num_bound_violations
        self.core.notify_ledger_changed()
        self._dispatch_soon(now)
        return consumed

    def _group_aborted(self, aborted: GroupAborted, now: float) -> None:
        reason = aborted.reason.name.lower()
        self._abort_children(aborted.prompt_id, [ref.child for ref in aborted.children_to_abort], reason, now)
        coordinator = self._coordinator()
        coordinator.on_group_drop(aborted.prompt_id, reason, now)
        if aborted.reason is AbortReason.FAILED:
            coordinator.on_refill([aborted.prompt_id], now)

    def _abort_children(self, prompt_id: int, children: list[int], reason: str, now: float) -> None:
        for child in children:
            traj = self.live.get(prompt_id * self.num_children + child)
            if traj is None:
                continue
            traj.abort_reason = reason
            instance = self.core.routed_instance(traj.request_id)
            if instance is None:  # still queued: it ends here
                self.core.abort(traj.request_id)
                self._ended(traj, now)
            else:
                self.engines[instance].abort(now, [traj.request_id], reason)
