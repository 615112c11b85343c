"""The router: request queue, worker selection, partial-rollout loopback, and the staleness ledger.

Generation requests come from the coordinator on the router's link; the router places each one
(`psrl.routing.RouterCore`: version eligibility, hints, group affinity, a reservation in the
ledger, the routing policy), sends it to the chosen instance, accumulates the streamed tokens,
and when the instance returns it:

* finished: count it in the ledger (the group's first N finished children win, the surplus are
  aborted) and pass the whole trajectory to the coordinator;
* interrupted (sync, migration, preemption, instance lost): loop it back into the queue with its
  tokens, pinned to its V_traj (partial rollout), or from scratch when partial rollout is off;
* aborted on request, or failed: tell the coordinator so the group can be refilled.

The ledger lives here so a routing decision never waits on the network; the coordinator drives
Occupy (GroupComplete), drops (GroupDrop) and Consume, and learns every ledger outcome as an
event. Each routed decision is logged with its inputs for `psrl replay --check`.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import msgspec

from actors.base import Actor, handles
from actors.links import Link
from actors.status import snapshot_from_status
from bus.messages import (
    Abort,
    ActorExited,
    BufferReady,
    Consume,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    GroupComplete,
    GroupDrop,
    InstanceStatus,
    InstanceSyncFailed,
    LedgerOp,
    Metrics,
    Occupy,
    Refill,
    Reserve,
    RouterStatus,
    RoutingRecord,
    SyncCommand,
    TokenChunk,
    VersionAborted,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Event
from psrl.routing.core import RouterCore
from psrl.routing.cost_model import load_cost_model
from psrl.routing.decision import RoutingDecision
from psrl.routing.policies import make_policy
from psrl.routing.request import RoutingRequest
from psrl.routing.trajectories import TrackerSettings, TrajectoryTracker, Verdict
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.oplog import (
    describe_abort,
    describe_consume,
    describe_finish,
    describe_occupy,
    describe_proactive,
)
from psrl.staleness.proactive import RetryOutcome, TruncateOutcome, apply_proactive_filter
from psrl.staleness.types import AbortReason, FinishVerdict, GroupAborted, LedgerError, LedgerSizes

COORDINATOR = "coordinator"
STATUS_INTERVAL_S = 0.1
JOIN_GRACE_S = 10.0
_ABORT_REASONS = {"filtered": AbortReason.FILTERED, "failed": AbortReason.FAILED, "retry": AbortReason.RETRY}


class RouterActor(Actor):
    ROLE = "router"

    def setup(self) -> dict[str, int]:
        cfg = self.config
        routing = cfg.psrl.rollout_coordination.routing_strategy
        cost = load_cost_model(routing.cost_model_path) if routing.cost_model_path else None
        if routing.admission_reject_on_waiting:
            # Requests beyond an engine's batch would wait inside it, where they cannot be moved.
            cap = cfg.engine.max_num_seqs
            current = routing.max_concurrent_seqs_per_instance
            routing = routing.model_copy(update={"max_concurrent_seqs_per_instance": min(cap, current or cap)})
        initial = int(self.boot.options.get("initial_version", 0))
        self.ledger = StalenessLedger(LedgerSizes.from_config(cfg), next_buffer_id=initial)
        self.core = RouterCore(routing, self.ledger, make_policy(routing, cost))
        self.method = routing.method
        self.needs_tokens = routing.method.startswith("cache_aware")
        pr = cfg.psrl.rollout_coordination.partial_rollout
        self.tracker = TrajectoryTracker(TrackerSettings(pr.enable, pr.interrupt_as_prompt,
                                                         cfg.psrl.agentic_rl.retry_limit))  # fmt: skip
        self.n_per_prompt = cfg.responses_per_prompt
        self.is_sticky = routing.enable_trajectory_sticky
        self.proactive = cfg.psrl.rollout_coordination.proactive_filter_strategy
        self.ps_version = int(self.boot.options.get("initial_version", 0))
        self.truncating: dict[int, tuple[set[int], Occupy, GroupComplete]] = {}  # prompt -> (children, occupy, done)
        self.link = Link(self.ctx, self.boot.endpoint(self.name), sender=self.name, incarnation=self.boot.incarnation,
                         settings=self.bus, serve=True)  # fmt: skip
        self.add_input(self.link.socket, self._on_link)
        self.instances: dict[str, int] = {}  # instance -> version it advertises
        self.num_expected_instances = cfg.topology.n_rollout_instances
        self.first_join: float | None = None
        self.syncing: set[str] = set()
        self.counters: Counter[str] = Counter()
        self.every(STATUS_INTERVAL_S, self._publish_status)
        # The log's first router event: replay starts this incarnation's ledger from it, before any op.
        self.publisher.publish(self._status())
        return {}

    @property
    def num_inflight(self) -> int:
        return len(self.tracker.live)

    # ------------------------------------------------------------------ link input

    def _on_link(self) -> None:
        received = self.link.recv()
        if received is not None:
            for event in received[1]:
                self.dispatch(event)

    @handles(GenerateRequest, link=True)
    def _on_request(self, event: Event[GenerateRequest]) -> None:
        req = event.message
        if req.request_id in self.tracker.live:
            self.counters["duplicate_requests"] += 1
            return
        traj = self.tracker.add(req, req.request_id % self.n_per_prompt)
        self.core.submit(self._routing_request(traj))

    def _routing_request(self, traj: Any) -> RoutingRequest:
        tokens = tuple(int(t) for t in traj.prompt_ids) + tuple(traj.token_ids) if self.needs_tokens else ()
        return RoutingRequest(traj.request_id, traj.prompt_id, traj.child, traj.v_traj,
                              num_prompt_tokens=len(traj.prompt_ids), num_response_tokens=traj.num_generated,
                              token_ids=tokens, is_sticky=self.is_sticky)  # fmt: skip

    @handles(TokenChunk, link=True)
    def _on_chunk(self, event: Event[TokenChunk]) -> None:
        c = event.message
        self.tracker.extend(c.request_id, c.token_ids, c.logprobs, c.versions)

    @handles(InstanceStatus, link=True)
    def _on_status(self, event: Event[InstanceStatus]) -> None:
        s = event.message
        if s.instance not in self.instances:
            self.instances[s.instance] = s.weight_version
            self.core.add_instance(s.instance, s.weight_version, s.kv_capacity_tokens)
            self.first_join = self.first_join or time.monotonic()
            self.log.info("instance joined", instance=s.instance, version=s.weight_version)
        self.core.apply_snapshot(snapshot_from_status(s))

    @handles(GenerateResult, link=True)
    def _on_result(self, event: Event[GenerateResult]) -> None:
        result = event.message
        # Every result an instance returns (finished or interrupted) is logged: a replay can follow
        # a trajectory across partial-rollout continuations and lost instances.
        self.publisher.publish(result, request_id=result.request_id, prompt_id=result.prompt_id,
                               model_version=event.envelope.model_version)  # fmt: skip
        traj = self.tracker.live.get(result.request_id)
        if traj is None:
            self.counters["late_results"] += 1
            return
        verdict = self.tracker.judge(result)
        if traj.abort_reason == "truncate" and verdict in (Verdict.ABORTED, Verdict.FINISHED):
            self.core.release(result.request_id)
            self._truncated(traj, result)
            return
        if verdict in (Verdict.CONTINUE, Verdict.RESTART):
            self.core.loop_back(result.request_id, traj.num_generated, self._routing_request(traj).token_ids)
            return
        self.core.release(result.request_id)
        if verdict is Verdict.RETRY:
            self.core.submit(self._routing_request(traj))
        elif verdict is Verdict.FINISHED:
            self._finished(traj, result)
        else:
            self._ended(traj.request_id, FinishReason.ERROR if verdict is Verdict.FAILED else FinishReason.ABORT)

    def _finished(self, traj: Any, result: GenerateResult) -> None:
        outcome = self.ledger.finish_child(traj.prompt_id, traj.child)
        self._log_op("finish", traj.prompt_id, traj.child, "", describe_finish(outcome))
        if outcome.verdict in (FinishVerdict.LATE, FinishVerdict.UNKNOWN, FinishVerdict.DUPLICATE):
            self.counters[f"finish_{outcome.verdict.name.lower()}"] += 1
            self.tracker.finish(traj.request_id, wasted=True)
            return
        self.tracker.finish(traj.request_id)
        self.link.send(self.tracker.result_for(traj, result.finish_reason, result.instance), COORDINATOR,
                       request_id=traj.request_id, prompt_id=traj.prompt_id, model_version=traj.v_traj)  # fmt: skip
        self._maybe_filter()
        if outcome.verdict is FinishVerdict.GROUP_COMPLETE:
            self._abort_children(traj.prompt_id, [ref.child for ref in outcome.surplus], "surplus")
            winners = [traj.prompt_id * self.n_per_prompt + c for c in outcome.winners]
            self.link.send(GroupComplete(traj.prompt_id, winners), COORDINATOR, prompt_id=traj.prompt_id)

    def _truncated(self, traj: Any, result: GenerateResult) -> None:
        """A child stopped by the proactive filter `truncate`: its partial output is its response."""
        self.tracker.finish(traj.request_id)
        self.link.send(self.tracker.result_for(traj, FinishReason.LENGTH, result.instance), COORDINATOR,
                       request_id=traj.request_id, prompt_id=traj.prompt_id, model_version=traj.v_traj)  # fmt: skip
        pending = self.truncating.get(traj.prompt_id)
        if pending is None:
            return
        pending[0].discard(traj.child)
        if not pending[0]:
            del self.truncating[traj.prompt_id]
            self._announce_truncated(pending[1], pending[2])

    def _announce_truncated(self, occupy: Occupy, done: GroupComplete) -> None:
        """The winners (marked as already occupied, so the coordinator does not ask again), then the slot."""
        self.link.send(done, COORDINATOR, prompt_id=occupy.prompt_id)
        self.publisher.publish(occupy, prompt_id=occupy.prompt_id)
        self.link.send(occupy, COORDINATOR, prompt_id=occupy.prompt_id)
        if self.ledger.is_ready(occupy.buffer) and not self.truncating:
            self._buffer_ready(occupy.buffer)

    def _buffer_ready(self, buffer: int) -> None:
        ready = BufferReady(buffer, self.ledger.occupied_groups(buffer))
        self.publisher.publish(ready)
        self.link.send(ready, COORDINATOR)

    def _ended(self, request_id: int, reason: FinishReason) -> None:
        """A trajectory ended without finishing: the ledger and the coordinator learn of it."""
        traj = self.tracker.finish(request_id, wasted=True)
        if traj is None:
            return
        if traj.abort_reason not in ("surplus", "stale", "group"):
            aborted = self.ledger.abort_child(traj.prompt_id, traj.child, AbortReason.FAILED)
            self._log_op("abort_child", traj.prompt_id, traj.child, "FAILED", describe_abort(aborted))
            if aborted is not None:
                self._group_aborted(aborted)
        self.link.send(self.tracker.result_for(traj, reason, traj.instance or ""), COORDINATOR,
                       request_id=request_id, prompt_id=traj.prompt_id)  # fmt: skip

    # ------------------------------------------------------------------ coordinator commands

    @handles(Abort, link=True)
    def _on_abort(self, event: Event[Abort]) -> None:
        for rid in event.message.request_ids:
            traj = self.tracker.live.get(rid)
            if traj is not None:
                self._abort_one(rid, event.message.reason or "requested")

    @handles(GroupComplete, link=True)
    def _on_group_complete(self, event: Event[GroupComplete]) -> None:
        prompt_id = event.message.prompt_id
        reserved = self.ledger.group_buffer(prompt_id)
        version = self.ledger.group_version(prompt_id)
        try:
            outcome = self.ledger.occupy(prompt_id)
            self._log_op("occupy", prompt_id, -1, "", describe_occupy(outcome))
        except LedgerError as exc:  # the group was dropped (e.g. stale) while its rewards were computed
            self._log_op("occupy", prompt_id, -1, "", f"error: {type(exc).__name__}: {exc}")
            self.counters["occupy_refused"] += 1
            self.link.send(GroupDrop(prompt_id, f"gone: {exc}"), COORDINATOR, prompt_id=prompt_id)
            return
        if outcome.buffer_id is None:
            self.link.send(GroupDrop(prompt_id, "no_room"), COORDINATOR, prompt_id=prompt_id)
        else:
            slot = self.ledger.occupied_groups(outcome.buffer_id).index(prompt_id)
            occupy = Occupy(prompt_id, version if version is not None else -1,
                            reserved if reserved is not None else -1, outcome.buffer_id, slot)  # fmt: skip
            self.publisher.publish(occupy, prompt_id=prompt_id)
            self.link.send(occupy, COORDINATOR, prompt_id=prompt_id)
        for aborted in outcome.aborted:
            self._group_aborted(aborted)
        if outcome.is_buffer_ready and outcome.buffer_id is not None and not self.truncating:
            self._buffer_ready(outcome.buffer_id)
        self.core.notify_ledger_changed()
        self._maybe_filter()

    @handles(GroupDrop, link=True)
    def _on_group_drop(self, event: Event[GroupDrop]) -> None:
        reason = _ABORT_REASONS.get(event.message.reason, AbortReason.CANCELLED)
        aborted = self.ledger.abort_group(event.message.prompt_id, reason)
        self._log_op("abort_group", event.message.prompt_id, -1, reason.name, describe_abort(aborted))
        if aborted is not None:
            self._abort_children(aborted.prompt_id, [ref.child for ref in aborted.children_to_abort], "group")
        self.core.notify_ledger_changed()

    @handles(Consume, link=True)
    def _on_consume(self, event: Event[Consume]) -> None:
        try:
            consumed = self.ledger.consume(event.message.buffer)
        except LedgerError as exc:
            self._log_op("consume", event.message.buffer, -1, "", f"error: {type(exc).__name__}: {exc}")
            self.log.error("consume refused", buffer=event.message.buffer, error=str(exc))
            return
        self._log_op("consume", event.message.buffer, -1, "", describe_consume(consumed))
        self.publisher.publish(event.message)
        values = {f"staleness/count_{k}": float(v) for k, v in consumed.staleness_histogram.items()}
        values["staleness/bound_violations"] = float(consumed.num_bound_violations)
        self.publisher.publish(Metrics(event.message.buffer, values))
        self.core.notify_ledger_changed()
        self._maybe_filter()

    @handles(WeightsPublished)
    def _on_published(self, event: Event[WeightsPublished]) -> None:
        self.ps_version = max(self.ps_version, event.message.version)
        self._maybe_filter()

    def _maybe_filter(self) -> None:
        """The proactive filter acts on the buffer the trainer is waiting for (its version exists)."""
        method = self.proactive.method
        buffer = self.ledger.next_buffer_id
        if method is None or buffer > self.ps_version or self.truncating:
            return
        outcome = apply_proactive_filter(self.ledger, method, self.proactive.threshold)
        self._log_op("proactive", buffer, self.proactive.threshold, method, describe_proactive(outcome))
        if isinstance(outcome, RetryOutcome):
            self._after_retry(outcome)
        elif isinstance(outcome, TruncateOutcome):
            self._after_truncate(outcome)
        if outcome is not None:
            self.core.notify_ledger_changed()

    def _after_retry(self, outcome: RetryOutcome) -> None:
        for aborted in outcome.aborted:
            self._group_aborted(aborted)
        for slot, prompt_id in enumerate(self.ledger.occupied_groups(outcome.buffer_id)):
            if prompt_id in outcome.moved:
                version = self.ledger.group_version(prompt_id)
                occupy = Occupy(prompt_id, -1 if version is None else version, -1, outcome.buffer_id, slot)
                self.publisher.publish(occupy, prompt_id=prompt_id)
                self.link.send(occupy, COORDINATOR, prompt_id=prompt_id)
        if outcome.num_fresh_prompts:
            self.link.send(Refill(outcome.num_fresh_prompts, "retry", []), COORDINATOR)
        if outcome.is_buffer_ready:
            self._buffer_ready(outcome.buffer_id)

    def _after_truncate(self, outcome: TruncateOutcome) -> None:
        for group, occupancy in zip(outcome.groups, outcome.occupancies, strict=True):
            self._abort_children(group.prompt_id, [ref.child for ref in group.surplus], "surplus")
            if occupancy.buffer_id is None:
                continue
            slot = self.ledger.occupied_groups(occupancy.buffer_id).index(group.prompt_id)
            version = self.ledger.group_version(group.prompt_id)
            occupy = Occupy(group.prompt_id, -1 if version is None else version, -1, occupancy.buffer_id, slot)
            winners = [group.prompt_id * self.n_per_prompt + c for c in group.winners]
            done = GroupComplete(group.prompt_id, winners, occupancy.buffer_id)
            children = {ref.child for ref in group.truncated}
            if children:
                self.truncating[group.prompt_id] = (children, occupy, done)
                self._abort_children(group.prompt_id, sorted(children), "truncate")
            else:
                self._announce_truncated(occupy, done)

    def _log_op(self, op: str, prompt_id: int, child: int, reason: str, outcome: str) -> None:
        self.publisher.publish(LedgerOp(op, prompt_id, child, reason, outcome), prompt_id=prompt_id)

    def _group_aborted(self, aborted: GroupAborted) -> None:
        """A group left the ledger: stop its children; a failed group's slot needs a fresh group.

        Stale and no-room groups are redundant work whose windows filled up: nothing replaces them.
        """
        reason = aborted.reason.name.lower()
        if aborted.reason is AbortReason.STALE:
            versions = [t.v_traj for t in self.tracker.live.values() if t.prompt_id == aborted.prompt_id]
            self.publisher.publish(VersionAborted(min(versions, default=-1), len(aborted.children_to_abort)),
                                   prompt_id=aborted.prompt_id)  # fmt: skip
        self._abort_children(aborted.prompt_id, [ref.child for ref in aborted.children_to_abort], reason)
        self.link.send(GroupDrop(aborted.prompt_id, reason), COORDINATOR, prompt_id=aborted.prompt_id)
        if aborted.reason is AbortReason.FAILED:
            self.link.send(Refill(1, reason, [aborted.prompt_id]), COORDINATOR)

    def _abort_children(self, prompt_id: int, children: list[int], reason: str) -> None:
        for child in children:
            self._abort_one(prompt_id * self.n_per_prompt + child, reason)

    def _abort_one(self, request_id: int, reason: str) -> None:
        traj = self.tracker.live.get(request_id)
        if traj is None:
            return
        traj.abort_reason = reason
        instance = self.core.routed_instance(request_id)
        if instance is None:  # still queued: it ends here
            self.core.abort(request_id)
            self._ended(request_id, FinishReason.ABORT)
        else:
            self.link.send(Abort([request_id], reason), instance)

    # ------------------------------------------------------------------ instances

    @handles(SyncCommand)
    def _on_sync(self, event: Event[SyncCommand]) -> None:
        """Hold routing while the instances of one sync load: placing work then would pile it onto
        whichever instance finishes first. Routing resumes when every one of them has loaded (or failed)."""
        for instance in event.message.instances:
            # Already at the version: its WeightsLoaded overtook this command on the other channel.
            if instance in self.instances and self.instances[instance] < event.message.version:
                self.syncing.add(instance)
                self.core.set_paused(instance, True)
        self._hold_routing_while_syncing()

    def _hold_routing_while_syncing(self) -> None:
        if self.syncing:
            self.core.pause()
        else:
            self.core.resume()

    @handles(WeightsLoaded)
    def _on_loaded(self, event: Event[WeightsLoaded]) -> None:
        msg = event.message
        if msg.instance in self.instances:
            self.instances[msg.instance] = msg.version
            self.syncing.discard(msg.instance)
            self.core.set_version(msg.instance, msg.version)
            self.core.set_paused(msg.instance, False)
            self.core.set_healthy(msg.instance, True)
            self._hold_routing_while_syncing()

    @handles(InstanceSyncFailed)
    def _on_sync_failed(self, event: Event[InstanceSyncFailed]) -> None:
        if event.message.instance in self.instances:  # out of rotation until a sync succeeds
            self.core.set_healthy(event.message.instance, False)
            self.syncing.discard(event.message.instance)
            self._hold_routing_while_syncing()

    @handles(ActorExited)
    def _on_exited(self, event: Event[ActorExited]) -> None:
        name = event.message.actor
        if name not in self.instances:
            return
        del self.instances[name]
        self.syncing.discard(name)
        self._hold_routing_while_syncing()
        for orphan in self.core.remove_instance(name):
            traj = self.tracker.live.get(orphan.request_id)
            if traj is None:
                continue
            self.tracker.interrupted(traj)
            self.core.submit(self._routing_request(traj))
        self.log.warning("instance lost; its requests are re-routed", instance=name)

    # ------------------------------------------------------------------ routing

    def step(self) -> bool:
        if self.core.num_queued == 0 or not self._all_joined():
            return False
        result = self.core.dispatch(time.monotonic())
        for decision in result.routed:
            self._send(decision)
        return bool(result.routed)

    def _all_joined(self) -> bool:
        """Route only once every instance has joined (or after a grace period), so the first wave of
        requests is not piled onto whichever instance reported first."""
        if len(self.instances) >= self.num_expected_instances:
            return True
        return self.first_join is not None and time.monotonic() - self.first_join > JOIN_GRACE_S

    def _send(self, decision: RoutingDecision) -> None:
        traj = self.tracker.live[decision.request_id]
        instance = decision.instance_id or ""
        traj.v_traj = decision.version_tag
        traj.instance = instance
        if decision.reserved_buffer is not None:
            self.publisher.publish(Reserve(traj.prompt_id, decision.version_tag, decision.reserved_buffer, -1),
                                   request_id=traj.request_id, prompt_id=traj.prompt_id)  # fmt: skip
        request = self.tracker.engine_request(traj, decision.dispatch_seq)
        if self.link.send(request, instance, request_id=traj.request_id, model_version=traj.v_traj) is None:
            # The instance vanished between its last status and now: route again.
            self.core.release(traj.request_id)
            self.tracker.interrupted(traj)
            self.core.submit(self._routing_request(traj))
            return
        record = RoutingRecord(traj.request_id, instance, self.method, msgspec.msgpack.encode(decision))
        self.publisher.publish(record, request_id=traj.request_id, prompt_id=traj.prompt_id,
                               model_version=traj.v_traj)  # fmt: skip

    def _status(self) -> RouterStatus:
        versions = sorted(set(self.instances.values()))
        counts = self.core.servable_counts(versions) if versions else {}
        return RouterStatus(
            self.core.num_queued, len(self.tracker.live) - self.core.num_queued, versions,
            [counts[v].without_new_entry for v in versions], [counts[v].with_new_entry for v in versions],
            self.ledger.next_buffer_id, self.tracker.num_loopbacks, self.tracker.num_wasted_tokens,
        )  # fmt: skip

    def _publish_status(self) -> None:
        status = self._status()
        self.publisher.publish(status)
        self.link.send(status, COORDINATOR)

    def teardown(self) -> None:
        if hasattr(self, "link"):
            self.link.close()
        if self.counters:
            self.log.info("router counters", **dict(self.counters))
