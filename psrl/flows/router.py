"""The router's algorithm: request queue, worker selection, partial-rollout loopback, and the ledger.

Generation requests come from the coordinator; the router places each one (``RouterCore``:
version eligibility, hints, group affinity, a reservation in the staleness ledger, the routing
policy), sends it to the chosen instance, accumulates the streamed tokens, and when the instance
returns it:

* finished: count it in the ledger (the group's first N finished children win, the surplus are
  aborted) and pass the whole trajectory to the coordinator;
* interrupted (sync, migration, preemption, instance lost): loop it back into the queue with its
  tokens, pinned to its V_traj (partial rollout), or from scratch when partial rollout is off;
* aborted on request, or failed: tell the coordinator so the group can be refilled.

With ``env.enable`` every trajectory is a multi-turn session: a finished turn goes to the session
scheduler (``TurnDone``) and the trajectory waits, keeping its ledger reservation and its pinned
version, until the scheduler sends the environment's reply (``TurnNext``: route the next turn,
sticky to the session's instance) or the end (``SessionEnd``: finish with the environment's
reward, or fail). Each placed turn is reported (``TurnStarted``) so the scheduler knows the pin.
When the scheduler dies its sessions keep waiting: its replacement rebuilds them from the event
log (``psrl.flows.session_recovery``), and what could not be delivered to it meanwhile is held
here and sent, in order, from the status tick once it is back (``held_sessions``).

The ledger lives here so a routing decision never waits on the network; the coordinator drives
Occupy (GroupAccept), drops (GroupDrop) and Consume, and learns every ledger outcome. The
ledger side of the flow is ``psrl.flows.router_ledger``.

State, all of it rebuilt from the messages handled: ``ledger`` (staleness buffers), ``core``
(queue, instances, pins), ``tracker`` (live trajectories and their tokens), ``instances`` (the
version each instance advertises), ``syncing`` and ``truncating``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from bus.messages import (
    Abort,
    ActorExited,
    Consume,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    GroupAccept,
    GroupDrop,
    InstanceDrained,
    InstanceStatus,
    InstanceSyncFailed,
    KvTierReport,
    Reserve,
    RouterStatus,
    RoutingRecord,
    ScaleDecided,
    SessionEnd,
    SessionGone,
    SyncCommand,
    TokenBatch,
    TurnDone,
    TurnNext,
    TurnStarted,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Message
from psrl.config import Config
from psrl.config.coordination import RoutingStrategy
from psrl.engine_cost.model import CostModel
from psrl.flows.effects import Effect, Handler, Send, Timer
from psrl.flows.router_ledger import COORDINATOR, RouterLedgerFlow
from psrl.flows.router_recovery import RECALL, SESSION_NOT_REBUILT, RestoredRequest, RouterRecovery
from psrl.flows.status import snapshot_from_status
from psrl.gateway.branch import cut_prompt, cut_response
from psrl.routing.core import RouterCore
from psrl.routing.decision import RoutingDecision
from psrl.routing.policies import make_policy
from psrl.routing.request import RoutingRequest
from psrl.routing.tier_directory import TierDirectory
from psrl.routing.trajectories import TrackedTrajectory, TrackerSettings, TrackerVerdict, TrajectoryTracker
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.types import LedgerSizes

SESSION = "session"  # the session scheduler's actor name
STATUS_INTERVAL_S = 0.1  # RouterStatus to the coordinator (its sync decisions read the servable counts)
JOIN_GRACE_S = 10.0  # route after this long even if not every instance has joined
RECALL_TIMEOUT_S = 10.0  # a restarted router's wait for its predecessor's requests to come back
DRAIN = "migrate"  # why a retiring instance hands its requests back: they continue elsewhere, as migrated


def effective_routing(config: Config) -> RoutingStrategy:
    """``routing_strategy`` as the router runs it: in-flight requests per instance capped at the engine's
    batch when ``admission_reject_on_waiting`` is on (requests beyond it would wait inside the engine,
    where they cannot be moved)."""
    routing = config.psrl.rollout_coordination.routing_strategy
    if routing.admission_reject_on_waiting:
        cap, current = config.engine.max_num_seqs, routing.max_concurrent_seqs_per_instance
        routing = routing.model_copy(update={"max_concurrent_seqs_per_instance": min(cap, current or cap)})
    return routing


class RouterFlow(RouterLedgerFlow):
    BUS_KINDS = (WeightsPublished, SyncCommand, WeightsLoaded, InstanceSyncFailed, ActorExited, ScaleDecided)

    def __init__(
        self,
        config: Config,
        *,
        cost: CostModel | None = None,
        initial_version: int = 0,
        record_decisions: bool = True,
        recovery: RouterRecovery | None = None,
        log: Any = None,
    ) -> None:
        routing = effective_routing(config)
        pr = config.psrl.rollout_coordination.partial_rollout
        ledger = (
            recovery.ledger
            if recovery is not None
            else StalenessLedger(LedgerSizes.from_config(config), next_buffer_id=initial_version)
        )
        tracker = TrajectoryTracker(
            TrackerSettings(
                partial_rollout=pr.enable,
                interrupt_as_prompt=pr.interrupt_as_prompt,
                retry_limit=config.psrl.agentic_rl.retry_limit,
            )
        )
        instances: dict[str, int] = {}  # instance -> the version it advertises
        # the instances' offload tiers, as their reports describe them (scored by cache_aware_v1)
        self.tiers = TierDirectory(config.engine.block_size, instances.get) if config.psrl.lmcache.enable else None
        self.kv_transfer = routing.kv_transfer.enable and self.tiers is not None
        self.kv_holders: dict[int, str] = {}  # re-routed request -> the instance that holds its KV
        core = RouterCore(
            routing, ledger, make_policy(routing, cost), offload_tier=self.tiers, record_inputs=record_decisions
        )
        super().__init__(config, ledger, core, tracker, record_decisions=record_decisions, log=log)
        self.method = routing.method
        self.needs_tokens = routing.method.startswith("cache_aware")
        self.is_sticky = routing.enable_trajectory_sticky
        self.has_sessions = config.env.enable
        self.ps_version = max(initial_version, recovery.ps_version if recovery is not None else 0)
        self.recovery = recovery
        if recovery is not None:
            self.taken = recovery.taken
        # requests a restarted router asked their instances to hand back (request -> instance), and
        # until when it waits for them before continuing them from the tokens of their last dispatch
        self.recalled: dict[int, str] = {}
        self.recalls_pending: dict[str, list[int]] = {}
        self.recall_deadline = 0.0
        # messages for the coordinator while it cannot be reached (a restarted router's link waits for
        # it to reconnect): sent in order on the next status tick
        self.held: list[Send] = []
        self.held_sessions: list[Send] = []  # for a session scheduler being restarted, in order
        self.is_holding = recovery is not None  # until the first status tick
        self.instances = instances
        self.num_expected_instances = config.topology.n_rollout_instances
        self.first_join: float | None = None
        self.syncing: set[str] = set()
        # instances removed by psrl scale, until they exit: no new work; -> requests handed back so far
        self.retiring: dict[str, int] = {}
        self.drained: set[str] = set()  # retiring instances reported drained (router.drained)
        # out of rotation: a send could not reach it (until it reports again), or its last sync failed
        self.unreachable: set[str] = set()
        self.sync_failed: set[str] = set()

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            GenerateRequest: self._on_request,  # from the coordinator: a trajectory to generate
            TokenBatch: self._on_token_batch,  # from an instance: one step's tokens of all its requests
            InstanceStatus: self._on_status,  # from an instance: its load
            GenerateResult: self._on_result,  # from an instance: a request handed back
            Abort: self._on_abort,  # from the coordinator
            GroupAccept: self._on_group_accept,  # from the coordinator: occupy the kept group's slot
            GroupDrop: self._on_group_drop,  # from the coordinator: give the group up
            Consume: self._on_consume,  # from the coordinator: the trainer took a buffer
            WeightsPublished: self._on_published,
            SyncCommand: self._on_sync,
            WeightsLoaded: self._on_loaded,
            InstanceSyncFailed: self._on_sync_failed,
            ActorExited: self._on_exited,
            ScaleDecided: self._on_scaled,  # from the supervisor: the instance set changed (psrl scale)
            KvTierReport: self._on_tier_report,  # from an instance: its offload tier's changes
            TurnNext: self._on_turn_next,  # from the session scheduler: a session's next turn
            SessionEnd: self._on_session_end,  # from the session scheduler: a session is over
        }

    def timers(self) -> list[Timer]:
        return [Timer("status", STATUS_INTERVAL_S, self.status)]

    def start(self, now: float) -> list[Effect]:
        """The flow's first effect: its status, published (the coordinator may not be connected yet),
        which starts the ledger's replay of this incarnation. A restarted router then takes up what
        its predecessor left (``psrl.flows.router_recovery``)."""
        self.publish(self._status())
        if self.recovery is not None:
            self._restore(self.recovery, now)
        return self.take()

    # ------------------------------------------------------------------ after a restart

    def _restore(self, recovery: RouterRecovery, now: float) -> None:
        """Trajectories alive at the crash, by the rule in ``router_recovery``, then the coordinator's
        commands the dead router never handled, in the order they were sent."""
        recalls: dict[str, list[int]] = {}
        for restored in recovery.requests.values():
            traj = self._restored_trajectory(restored)
            if self.has_sessions and not restored.session.exact and restored.counted is None:
                traj.error = SESSION_NOT_REBUILT  # the rule in router_recovery
                self.counters["sessions_not_rebuilt"] += 1
                self.ended(traj.request_id, FinishReason.ERROR)
                continue
            if restored.dispatch is None:
                self.core.submit(self._routing_request(traj))
                continue
            self.recalled[traj.request_id] = restored.instance
            if restored.result is not None:
                self._on_result(restored.result, now)
            else:
                recalls.setdefault(restored.instance, []).append(traj.request_id)
        self.recalls_pending = recalls  # asked for once each instance is connected (its first status)
        self.recall_deadline = now + RECALL_TIMEOUT_S
        for command in recovery.commands:
            self._handlers[type(command)](command, now)
        for instance in recovery.retiring:  # it hands back what it holds when it is shut down
            self._retire(instance)
        self.counters["restored_requests"] += len(recovery.requests)
        self.counters["owed_finishes"] += sum(1 for r in recovery.requests.values() if r.counted is not None)
        self.counters["recalled_requests"] += sum(len(ids) for ids in recalls.values())
        self.counters["replayed_commands"] += len(recovery.commands)
        if self.log is not None:
            self.log.warning("router restarted: ledger and trajectories rebuilt from the event log",
                             next_buffer=self.ledger.next_buffer_id, **dict(self.counters))  # fmt: skip

    def _restored_trajectory(self, restored: RestoredRequest) -> TrackedTrajectory:
        traj = self.tracker.add(restored.request, restored.request.request_id % self.n_per_prompt)
        traj.flags, traj.result_instances = restored.flags, set(restored.result_instances)
        if restored.counted is not None:  # its finish is in the ledger; the coordinator never got it
            self.owed_finishes[traj.request_id] = restored.counted
        dispatch = restored.dispatch
        if dispatch is not None:  # the trajectory as the dead router last sent it out
            traj.v_traj, traj.instance = dispatch.pinned_version, restored.instance
            traj.abort_reason = restored.abort_reason
            if dispatch.generated_token_ids is not None:
                traj.token_ids = np.asarray(dispatch.generated_token_ids, np.int32)
                traj.logprobs = np.asarray(dispatch.generated_logprobs, np.float32)
                traj.versions = np.asarray(dispatch.generated_versions, np.int32)
                traj.loss_mask = np.ones(len(traj.token_ids), np.uint8)
            if self.has_sessions and restored.session.turn > 0 and restored.session.exact:
                _continue_session(traj, restored, dispatch)
        return traj

    def _recall_expired(self, now: float) -> None:
        """Recalled requests their instance never handed back (it no longer had them): continue them
        from the tokens of their last dispatch."""
        if not self.recalled or now < self.recall_deadline:
            return
        self.recalls_pending = {}  # an instance that never reconnected: its requests are continued elsewhere
        for request_id in list(self.recalled):
            self._recall_lost(request_id)

    def send(self, to: str, message: Message, **ids: Any) -> None:
        if to == COORDINATOR and (self.is_holding or self.held) and not isinstance(message, RouterStatus):
            self.held.append(Send(to, message, **ids))  # after what is already waiting, in order
            return
        if to == SESSION and self.held_sessions:
            self.held_sessions.append(Send(to, message, **ids))
            return
        super().send(to, message, **ids)

    def _recall_lost(self, request_id: int) -> None:
        if self.recalled.pop(request_id, None) is not None:
            self.counters["recalls_unanswered"] += 1
            self._route_again(request_id)

    @property
    def num_inflight(self) -> int:
        return len(self.tracker.live)

    # ------------------------------------------------------------------ trajectories

    def _on_request(self, req: GenerateRequest, now: float) -> None:
        if self.is_copy(req):
            return
        traj = self.tracker.add(req, req.request_id % self.n_per_prompt)
        self.core.submit(self._routing_request(traj))

    def _routing_request(
        self, traj: TrackedTrajectory, *, hint: str | None = None, force_pin: bool = False
    ) -> RoutingRequest:
        tokens = tuple(traj.prompt_ids.tolist()) + tuple(traj.token_ids.tolist()) if self.needs_tokens else ()
        return RoutingRequest(
            traj.request_id,
            traj.prompt_id,
            traj.child,
            traj.v_traj,
            num_prompt_tokens=len(traj.prompt_ids),
            num_response_tokens=traj.num_generated,
            token_ids=tokens,
            hint_instance=hint,
            is_sticky=self.is_sticky,
            force_pin_once=force_pin,
        )

    def _on_token_batch(self, batch: TokenBatch, now: float) -> None:
        ends = np.cumsum(batch.counts, dtype=np.int64)
        if len(batch.request_ids) != len(batch.counts) or not (
            len(batch.token_ids) == len(batch.logprobs) == len(batch.versions) == (int(ends[-1]) if len(ends) else 0)
        ):
            self.counters["malformed_token_batches"] += 1
            return
        start = 0
        for request_id, end in zip(batch.request_ids.tolist(), ends.tolist(), strict=True):
            self.tracker.extend(
                request_id, batch.token_ids[start:end], batch.logprobs[start:end], batch.versions[start:end]
            )
            start = end

    def _on_result(self, result: GenerateResult, now: float) -> None:
        self._take_result(result, now)
        if result.instance in self.retiring:
            self._report_if_drained(result.instance)

    def _take_result(self, result: GenerateResult, now: float) -> None:
        traj = self.tracker.live.get(result.request_id)
        if traj is None:
            self.counters["late_results"] += 1
            return
        recalled = self.recalled.get(result.request_id)
        if result.instance != (recalled or self.core.routed_instance(result.request_id)):
            self.counters["stale_results"] += 1  # from an instance the request is no longer at
            return
        self.recalled.pop(result.request_id, None)
        verdict = self.tracker.judge(result)
        if traj.abort_reason == "truncate" and verdict in (TrackerVerdict.ABORTED, TrackerVerdict.FINISHED):
            self.core.release(result.request_id)
            self.truncated(traj, result.instance)
            return
        if verdict in (TrackerVerdict.CONTINUE, TrackerVerdict.RESTART):
            if self.kv_transfer and result.instance:
                self.kv_holders[result.request_id] = result.instance
            if recalled is not None:  # routed by the dead router: this one's queue never had it
                self.core.submit(self._routing_request(traj, hint=recalled))
            else:
                self.core.loop_back(result.request_id, traj.num_generated, self._routing_request(traj).token_ids)
            return
        self.core.release(result.request_id)
        if verdict is TrackerVerdict.RETRY:
            self.core.submit(self._routing_request(traj))
        elif verdict is TrackerVerdict.FINISHED and self.has_sessions:
            self._turn_done(traj, result)
        elif verdict is TrackerVerdict.FINISHED:
            self.finished(traj, result.finish_reason, result.instance)
        else:
            self.ended(traj.request_id, FinishReason.ERROR if verdict is TrackerVerdict.FAILED else FinishReason.ABORT)

    # ------------------------------------------------------------------ sessions

    def _turn_done(self, traj: TrackedTrajectory, result: GenerateResult) -> None:
        traj.in_env = True
        if self.is_sticky and result.instance:
            self.core.rest(traj.request_id, result.instance)  # its next turn comes back: load for new sessions
        turn = TurnDone(
            request_id=traj.request_id,
            prompt_id=traj.prompt_id,
            instance=result.instance,
            turn=traj.turn,
            token_ids=traj.token_ids[traj.turn_start :],
            num_tokens=len(traj.prompt_ids) + traj.num_generated,
            finish_reason=result.finish_reason,
            logprobs=traj.logprobs[traj.turn_start :],
        )
        self.send(SESSION, turn, request_id=traj.request_id, prompt_id=traj.prompt_id, model_version=traj.v_traj)

    def _session_waiting(self, request_id: int) -> TrackedTrajectory | None:
        traj = self.tracker.live.get(request_id)
        if traj is None or not traj.in_env:
            self.counters["late_session_messages"] += 1
            return None
        return traj

    def _on_turn_next(self, turn: TurnNext, now: float) -> None:
        traj = self._session_waiting(turn.request_id)
        if traj is None or turn.turn != traj.turn + 1:
            return
        if turn.cut_to >= 0 and not self._cut(traj, turn):
            return
        self.core.wake(turn.request_id)
        self.tracker.start_turn(traj, turn.observation_token_ids, turn.max_tokens)
        pinned = turn.force_pin_instance if self._serves(turn.force_pin_instance) else None
        last = traj.instance if traj.instance is not None and self._serves(traj.instance) else None
        self.core.submit(self._routing_request(traj, hint=pinned or last, force_pin=pinned is not None))

    def _cut(self, traj: TrackedTrajectory, turn: TurnNext) -> bool:
        """A branch (the agent edited its history): the response is cut back to the kept prefix, its
        four arrays alike, and a branch inside the prompt cuts the prompt too (the trajectory then
        carries a prompt of its own to the trainer); V_traj and the ledger reservation stay
        (``psrl.gateway.branch``). A cut past the response or prompt fails the session (a scheduler
        out of step with this trajectory)."""
        try:
            arrays = cut_response(traj.token_ids, traj.logprobs, traj.versions, traj.loss_mask, turn.cut_to)
            prompt = traj.prompt_ids
            if turn.prompt_keep >= 0:
                prompt = cut_prompt(traj.prompt_ids, turn.prompt_keep, turn.cut_to)
        except ValueError as exc:
            self.counters["bad_cuts"] += 1
            traj.in_env, traj.error = False, f"session {traj.request_id} turn {turn.turn}: {exc}"
            self.ended(traj.request_id, FinishReason.ERROR)  # the scheduler is told (SessionGone)
            return False
        traj.token_ids, traj.logprobs, traj.versions, traj.loss_mask = arrays
        if turn.prompt_keep >= 0:  # the trajectory carries this prompt of its own to the trainer
            traj.prompt_ids, traj.prompt_keep = prompt, turn.prompt_keep
            self.counters["session_prompt_cuts"] += 1
        self.counters["session_cuts"] += 1
        self.counters["session_tokens_cut"] += turn.num_cut
        return True

    def _on_session_end(self, end: SessionEnd, now: float) -> None:
        traj = self._session_waiting(end.request_id)
        if traj is None:
            return
        traj.in_env = False
        self.core.wake(end.request_id)
        if end.error:
            traj.error = f"session failed: {end.error}"
            self.ended(traj.request_id, FinishReason.ERROR)
            return
        traj.env_reward, traj.env_acc = end.reward, end.acc
        self.finished(traj, FinishReason.STOP, traj.instance or "")

    def left(self, traj: TrackedTrajectory) -> None:
        """A trajectory ended at the router (abort, failure, truncation): its session is over too."""
        self.core.wake(traj.request_id)
        if self.has_sessions:
            self.send(SESSION, SessionGone(request_id=traj.request_id, reason=traj.abort_reason or traj.error))

    def _on_abort(self, abort: Abort, now: float) -> None:
        for request_id in abort.request_ids:
            if request_id in self.tracker.live:
                self.abort_one(request_id, abort.reason or "requested")

    def abort_one(self, request_id: int, reason: str) -> None:
        traj = self.tracker.live.get(request_id)
        if traj is None:
            return
        traj.abort_reason = reason
        instance = self.core.routed_instance(request_id)
        if instance is None:  # still queued: it ends here
            self.core.abort(request_id)
            self.ended(request_id, FinishReason.ABORT)
        else:
            self.send(instance, Abort(request_ids=[request_id], reason=reason))

    def _on_published(self, published: WeightsPublished, now: float) -> None:
        self.ps_version = max(self.ps_version, published.version)
        self.maybe_filter()

    def filter_allowed(self) -> bool:
        """The proactive filter acts on the buffer the trainer waits for, once its version exists."""
        return self.ledger.next_buffer_id <= self.ps_version

    # ------------------------------------------------------------------ instances

    def _serves(self, instance: str) -> bool:
        """The instance takes new work: it has joined and is not retiring (a session's pin moves off it)."""
        return instance in self.instances and instance not in self.retiring

    def _refresh_health(self, instance: str) -> None:
        """In rotation unless it retires, could not be reached since its last report, or failed its last sync."""
        out = instance in self.retiring or instance in self.unreachable or instance in self.sync_failed
        self.core.set_healthy(instance, not out)

    def _on_status(self, status: InstanceStatus, now: float) -> None:
        if status.instance in self.retiring and status.instance not in self.instances:
            return  # removed before it joined: it never will
        if status.instance in self.unreachable and status.instance in self.instances:
            self.unreachable.discard(status.instance)  # it reports: it can be reached again
            self._refresh_health(status.instance)
        if status.instance not in self.instances:
            self.instances[status.instance] = status.weight_version
            self.core.add_instance(status.instance, status.weight_version, status.kv_capacity_tokens)
            self.first_join = self.first_join if self.first_join is not None else now
            if self.log is not None:
                self.log.info("instance joined", instance=status.instance, version=status.weight_version)
        elif status.weight_version > self.instances[status.instance]:
            # A load this router never heard of: its WeightsLoaded went out while the router was down (or
            # before it subscribed), so the instance's own report is the only word of it.
            self._loaded(status.instance, status.weight_version)
        recalls = self.recalls_pending.pop(status.instance, None)
        if recalls:  # connected now: the requests the dead router placed there come back
            self.send(status.instance, Abort(request_ids=recalls, reason=RECALL))
            self.recall_deadline = max(self.recall_deadline, now + RECALL_TIMEOUT_S)
        self.core.apply_snapshot(snapshot_from_status(status))

    def _on_sync(self, command: SyncCommand, now: float) -> None:
        """Hold routing while the instances of one sync load: placing work then would pile it onto
        whichever instance finishes first. Routing resumes when every one of them has loaded (or failed)."""
        for instance in command.instances:
            # Already at the version: its WeightsLoaded overtook this command on the other channel.
            if instance in self.instances and self.instances[instance] < command.version:
                self.syncing.add(instance)
                self.core.set_paused(instance, True)
        self._hold_routing_while_syncing()

    def _hold_routing_while_syncing(self) -> None:
        if self.syncing:
            self.core.pause()
        else:
            self.core.resume()

    def _on_loaded(self, loaded: WeightsLoaded, now: float) -> None:
        if loaded.instance in self.instances:
            self._loaded(loaded.instance, loaded.version)

    def _loaded(self, instance: str, version: int) -> None:
        self.instances[instance] = version
        self.syncing.discard(instance)
        self.core.set_version(instance, version)
        self.core.set_paused(instance, False)
        self.sync_failed.discard(instance)
        self._refresh_health(instance)
        self._hold_routing_while_syncing()

    def _on_sync_failed(self, failed: InstanceSyncFailed, now: float) -> None:
        if failed.instance in self.instances:  # out of rotation until a sync succeeds
            self.sync_failed.add(failed.instance)
            self._refresh_health(failed.instance)
            self.syncing.discard(failed.instance)
            self._hold_routing_while_syncing()

    def _on_exited(self, exited: ActorExited, now: float) -> None:
        name = exited.actor
        if name == SESSION and self.has_sessions:
            # its sessions wait: the replacement rebuilds them from the log (or, if the scheduler
            # cannot be restarted, the supervisor ends the run)
            self.counters["session_scheduler_exits"] += 1
            return
        self.retiring.pop(name, None)
        self.drained.discard(name)
        self.unreachable.discard(name)
        self.sync_failed.discard(name)
        if name not in self.instances:
            return
        del self.instances[name]
        if self.tiers is not None:
            self.tiers.remove(name)
        self.syncing.discard(name)
        self._hold_routing_while_syncing()
        for orphan in self.core.remove_instance(name):
            self._route_again(orphan.request_id)
        for request_id in [rid for rid, instance in self.recalled.items() if instance == name]:
            self._recall_lost(request_id)
        if self.log is not None:
            self.log.warning("instance lost; its requests are re-routed", instance=name)

    def _on_scaled(self, decided: ScaleDecided, now: float) -> None:
        """Instances removed from the set retire: no new work, their requests handed back to continue
        elsewhere from their tokens; the supervisor stops each once it is reported drained."""
        if decided.error or not decided.token:  # a loss, not a request: its exit re-routed its requests
            return
        for name in decided.removed:
            if name not in self.retiring:
                self._retire(name)

    def _retire(self, instance: str) -> None:
        held = self.core.routed_requests(instance) if instance in self.instances else []
        self.retiring[instance] = len(held)
        self.counters["instances_retired"] += 1
        if instance in self.instances:
            self.core.set_healthy(instance, False)  # out of every candidate set, pins included
            self.syncing.discard(instance)
            self._hold_routing_while_syncing()
        if held:
            self.send(instance, Abort(request_ids=sorted(held), reason=DRAIN))
        if self.log is not None:
            self.log.info("instance retiring; its requests continue elsewhere", instance=instance, requests=len(held))
        self._report_if_drained(instance)

    def _report_if_drained(self, instance: str) -> None:
        if instance in self.drained or self.core.routed_requests(instance):
            return
        self.drained.add(instance)
        self.publish(InstanceDrained(instance=instance, num_moved=self.retiring.get(instance, 0)))

    def _route_again(self, request_id: int) -> None:
        """A request left its instance without a result (the instance is gone): route it again."""
        traj = self.tracker.live.get(request_id)
        if traj is not None:
            self.tracker.interrupted(traj)
            self.core.submit(self._routing_request(traj))

    # ------------------------------------------------------------------ routing

    @property
    def has_work(self) -> bool:
        """Requests wait in the queue (a routing pass may place some)."""
        return self.core.num_queued > 0

    def route(self, now: float) -> list[Effect]:
        """One routing pass: the requests that can be placed now go to their instances."""
        if self.core.num_queued == 0 or not self._all_joined(now):
            return []
        for decision in self.core.dispatch(now).routed:
            self._dispatch(decision)
        return self.take()

    def _all_joined(self, now: float) -> bool:
        """Route only once every instance has joined (or after a grace period), so the first wave of
        requests is not piled onto whichever instance reported first."""
        if len(self.instances) >= self.num_expected_instances:
            return True
        return self.first_join is not None and now - self.first_join > JOIN_GRACE_S

    def _dispatch(self, decision: RoutingDecision) -> None:
        traj = self.tracker.live[decision.request_id]
        instance = decision.instance_id or ""
        traj.v_traj = decision.version_tag
        traj.instance = instance
        if decision.reserved_buffer is not None:
            reserve = Reserve(
                prompt_id=traj.prompt_id, version=decision.version_tag, buffer=decision.reserved_buffer, slot=-1
            )
            self.publish(reserve, request_id=traj.request_id, prompt_id=traj.prompt_id)
        if self.record_decisions:
            record = RoutingRecord(
                request_id=traj.request_id,
                instance=instance,
                policy=self.method,
                record=msgspec.msgpack.encode(decision),
            )
            self.publish(record, request_id=traj.request_id, prompt_id=traj.prompt_id, model_version=traj.v_traj)
        request = self._with_kv_source(self.tracker.engine_request(traj, decision.dispatch_seq), instance)
        self.send(instance, request, request_id=traj.request_id, model_version=traj.v_traj)
        if self.has_sessions:
            started = TurnStarted(
                request_id=traj.request_id,
                prompt_id=traj.prompt_id,
                instance=instance,
                turn=traj.turn,
                num_tokens=len(traj.prompt_ids) + traj.num_generated,
            )
            self.send(SESSION, started, request_id=traj.request_id, prompt_id=traj.prompt_id)

    def _with_kv_source(self, request: GenerateRequest, instance: str) -> GenerateRequest:
        """A re-routed request names the instance that holds its KV, if another one (KV transfer)."""
        holder = self.kv_holders.pop(request.request_id, "")
        address = "" if self.tiers is None else self.tiers.addresses.get(holder, "")
        if not holder or holder == instance or not address:
            return request
        return msgspec.structs.replace(request, kv_source=holder, kv_source_address=address)

    def _on_tier_report(self, report: KvTierReport, now: float) -> None:
        if self.tiers is not None and report.instance in self.instances:
            self.tiers.apply(report.instance, report.address, report.added.tolist(), report.removed.tolist(),
                             report.cleared, report.report_seq)  # fmt: skip

    def undeliverable(self, send: Send, now: float) -> list[Effect]:
        """A request whose instance vanished between its last status and the send is routed again;
        a message for the coordinator waits until it can be reached."""
        message = send.message
        if send.to == COORDINATOR:
            if not isinstance(message, RouterStatus):
                self.held.append(send)
        elif isinstance(message, GenerateRequest) and message.request_id in self.tracker.live:
            self._not_delivered(message.request_id, send.to)
        elif isinstance(message, Abort) and message.reason == RECALL:  # the instance is gone
            for request_id in message.request_ids:
                self._recall_lost(request_id)
        elif send.to == SESSION:  # the session scheduler is being restarted: it gets these once back
            self.counters["session_messages_held"] += 1
            self.held_sessions.append(send)
        return self.take()

    def _not_delivered(self, request_id: int, instance: str) -> None:
        """The request never reached ``instance`` (it is gone, or restarting): routed again as it was, not
        as interrupted (nothing of it ran; the log holds no send of it), and ``instance`` stays out of
        rotation until it reports again, so the next pass does not pick it again and again."""
        self.core.release(request_id)
        self.counters["undelivered_requests"] += 1
        if instance in self.instances and instance not in self.unreachable:
            self.unreachable.add(instance)
            self._refresh_health(instance)
        traj = self.tracker.live[request_id]
        traj.instance = None
        self.core.submit(self._routing_request(traj))

    # ------------------------------------------------------------------ status

    def _status(self) -> RouterStatus:
        versions = sorted({v for name, v in self.instances.items() if name not in self.retiring})
        counts = self.core.servable_counts(versions) if versions else {}
        return RouterStatus(
            num_queued=self.core.num_queued,
            num_inflight=len(self.tracker.live) - self.core.num_queued,
            versions=versions,
            servable_without_new_entry=[counts[v].without_new_entry for v in versions],
            servable_with_new_entry=[counts[v].with_new_entry for v in versions],
            next_buffer=self.ledger.next_buffer_id,
            num_loopbacks=self.tracker.num_loopbacks,
            num_wasted_tokens=self.tracker.num_wasted_tokens,
            recovered=self.recovery is not None,
        )

    def status(self, now: float) -> list[Effect]:
        self._recall_expired(now)
        self.send(COORDINATOR, self._status())
        held, self.held, self.is_holding = self.held, [], False
        for send in held:  # the status went first: if it cannot be delivered, these come back in order
            self.emit(send)
        held, self.held_sessions = self.held_sessions, []
        for send in held:  # the first that cannot be delivered holds the rest again, in order
            self.emit(send)
        return self.take()


def _continue_session(traj: TrackedTrajectory, restored: RestoredRequest, dispatch: GenerateRequest) -> None:
    """A session past its first turn: its earlier turns and answers (``router_recovery.SessionPrefix``)
    go before the current turn's tokens, sent as prompt, after its prompt (cut where a branch cut it),
    as the dead router held them."""
    ids, logprobs, versions, mask = restored.session.arrays(restored.session.turn, dispatch.pinned_version)
    traj.prompt_keep = restored.session.prompt_keep(restored.session.turn)
    traj.prompt_ids = restored.session.prompt(traj.prompt_ids, restored.session.turn)
    traj.token_ids = np.concatenate([ids, traj.token_ids])
    traj.logprobs = np.concatenate([logprobs, traj.logprobs])
    traj.versions = np.concatenate([versions, traj.versions])
    traj.loss_mask = np.concatenate([mask, traj.loss_mask])
    traj.turn, traj.turn_start, traj.num_sent_as_prompt = restored.session.turn, len(ids), len(ids)
    traj.sampling = dispatch.sampling
