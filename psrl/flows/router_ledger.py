"""The router's staleness-ledger side: finished children, Occupy, drops, Consume, the proactive filter.

Every call on the ledger is logged as a ``LedgerOp`` (with ``record_decisions``), so ``psrl replay
--check ledger`` can re-run them on a fresh ledger. What the ledger decides reaches the
coordinator: a finished trajectory (``TrajectoryDone``), a group's winners (``GroupFinished``),
its slot (``Occupy``), a full buffer (``BufferReady``), a group given up (``GroupDrop``) and fresh
groups to launch (``Refill``). Children the ledger gives up are aborted where they run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from typing import Any

from bus.messages import (
    BufferReady,
    Consume,
    FinishReason,
    GenerateRequest,
    GroupAccept,
    GroupDrop,
    GroupFinished,
    LedgerOp,
    Metrics,
    Occupy,
    Refill,
    VersionAborted,
)
from bus.schema import Message
from psrl.config import Config
from psrl.flows.base import Flow
from psrl.flows.once_each import OnceEach
from psrl.routing.core import RouterCore
from psrl.routing.trajectories import TrackedTrajectory, TrajectoryTracker
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.oplog import describe_abort, describe_consume, describe_finish, describe_occupy, describe_proactive
from psrl.staleness.proactive import RetryOutcome, TruncateOutcome, apply_proactive_filter
from psrl.staleness.types import AbortReason, FinishOutcome, FinishVerdict, GroupAborted, LedgerError

COORDINATOR = "coordinator"
_ABORT_REASONS = {"filtered": AbortReason.FILTERED, "failed": AbortReason.FAILED, "retry": AbortReason.RETRY}
_NOT_COUNTED = (FinishVerdict.LATE, FinishVerdict.UNKNOWN, FinishVerdict.DUPLICATE)
_NOT_REFILLED = ("surplus", "stale", "group")  # abort reasons that leave the ledger as it is


class RouterLedgerFlow(Flow, ABC):
    def __init__(
        self,
        config: Config,
        ledger: StalenessLedger,
        core: RouterCore,
        tracker: TrajectoryTracker,
        *,
        record_decisions: bool,
        log: Any = None,
    ) -> None:
        super().__init__()
        self.log = log
        self.counters: Counter[str] = Counter()
        self.ledger = ledger
        self.core = core
        self.tracker = tracker
        self.record_decisions = record_decisions
        self.n_per_prompt = config.responses_per_prompt
        self.proactive = config.psrl.rollout_coordination.proactive_filter_strategy
        # prompt -> (children still to stop, its Occupy, its GroupFinished): a truncated group's slot
        # is announced once the partial outputs of all its truncated children are in
        self.truncating: dict[int, tuple[set[int], Occupy, GroupFinished]] = {}
        # a restarted router's trajectories whose finish its predecessor counted but never delivered
        # (``psrl.flows.router_recovery``): request -> that finish's outcome
        self.owed_finishes: dict[int, FinishOutcome] = {}
        # requests and commands taken (psrl.flows.once_each): a copy from a restarted coordinator is dropped
        self.taken = OnceEach()

    def is_copy(self, message: Message) -> bool:
        """Whether ``message`` is a copy of a request or command taken before in this launch (counted)."""
        if self.taken.take(message):
            return False
        self.counters["duplicate_requests" if isinstance(message, GenerateRequest) else "duplicate_commands"] += 1
        return True

    @abstractmethod
    def abort_one(self, request_id: int, reason: str) -> None:
        """Stop one trajectory: where it runs, or here if it is still queued."""

    @abstractmethod
    def filter_allowed(self) -> bool:
        """Whether the proactive filter may act now."""

    def left(self, traj: TrackedTrajectory) -> None:
        """A trajectory ended here without finishing normally (abort, failure, truncation)."""

    # ------------------------------------------------------------------ trajectories that end

    def finished(self, traj: TrackedTrajectory, reason: FinishReason, instance: str) -> None:
        owed = self.owed_finishes.pop(traj.request_id, None)
        if owed is not None:
            self._deliver_owed(traj, reason, instance, owed)
            return
        outcome = self.ledger.finish_child(traj.prompt_id, traj.child)
        self._log_op("finish", traj.prompt_id, traj.child, "", describe_finish(outcome))
        if outcome.verdict in _NOT_COUNTED:
            self.counters[f"finish_{outcome.verdict.name.lower()}"] += 1
            self.tracker.finish(traj.request_id, wasted=True)
            return
        self.tracker.finish(traj.request_id)
        self._send_done(traj, reason, instance)
        self.maybe_filter()
        if outcome.verdict is FinishVerdict.GROUP_COMPLETE:
            self._abort_children(traj.prompt_id, [ref.child for ref in outcome.surplus], "surplus")
            self._send_group_finished(traj.prompt_id, outcome.winners)

    def _deliver_owed(self, traj: TrackedTrajectory, reason: FinishReason, instance: str, owed: FinishOutcome) -> None:
        """A finish the dead router counted but never delivered: the ledger holds it already (counting it
        again would make it a duplicate), so only the coordinator learns of it, as it would have: the
        trajectory, then the group's winners if that finish completed the group. What else the dead
        router did after that finish (the filter, the surplus aborts) is in the log and was rebuilt."""
        self.counters["owed_finishes_sent"] += 1
        self.tracker.finish(traj.request_id)
        self._send_done(traj, reason, instance)
        if owed.verdict is FinishVerdict.GROUP_COMPLETE:
            self._send_group_finished(traj.prompt_id, owed.winners)

    def _send_group_finished(self, prompt_id: int, winners: tuple[int, ...]) -> None:
        request_ids = [prompt_id * self.n_per_prompt + child for child in winners]
        self.send(COORDINATOR, GroupFinished(prompt_id=prompt_id, request_ids=request_ids), prompt_id=prompt_id)

    def _send_done(self, traj: TrackedTrajectory, reason: FinishReason, instance: str) -> None:
        self.send(
            COORDINATOR,
            self.tracker.done(traj, reason, instance),
            request_id=traj.request_id,
            prompt_id=traj.prompt_id,
            model_version=traj.v_traj,
        )

    def truncated(self, traj: TrackedTrajectory, instance: str) -> None:
        """A child stopped by the proactive filter ``truncate``: its partial output is its response."""
        self.tracker.finish(traj.request_id)
        self.left(traj)
        self._send_done(traj, FinishReason.TRUNCATED, instance)
        pending = self.truncating.get(traj.prompt_id)
        if pending is None:
            return
        pending[0].discard(traj.child)
        if not pending[0]:
            del self.truncating[traj.prompt_id]
            self._announce_truncated(pending[1], pending[2])

    def ended(self, request_id: int, reason: FinishReason) -> None:
        """A trajectory ended without finishing: the ledger and the coordinator learn of it."""
        traj = self.tracker.finish(request_id, wasted=True)
        if traj is None:
            return
        self.left(traj)
        if traj.abort_reason not in _NOT_REFILLED:
            aborted = self.ledger.abort_child(traj.prompt_id, traj.child, AbortReason.FAILED)
            self._log_op("abort_child", traj.prompt_id, traj.child, "FAILED", describe_abort(aborted))
            if aborted is not None:
                self._group_aborted(aborted)
        self.send(
            COORDINATOR,
            self.tracker.done(traj, reason, traj.instance or ""),
            request_id=request_id,
            prompt_id=traj.prompt_id,
        )

    # ------------------------------------------------------------------ coordinator commands

    def _on_group_accept(self, accept: GroupAccept, now: float) -> None:
        if self.is_copy(accept):
            return
        prompt_id = accept.prompt_id
        reserved = self.ledger.group_buffer(prompt_id)
        version = self.ledger.group_version(prompt_id)
        try:
            outcome = self.ledger.occupy(prompt_id)
            self._log_op("occupy", prompt_id, -1, "", describe_occupy(outcome))
        except LedgerError as exc:  # the group was dropped (e.g. stale) while its rewards were computed
            self._log_op("occupy", prompt_id, -1, "", f"error: {type(exc).__name__}: {exc}")
            self.counters["occupy_refused"] += 1
            self.send(COORDINATOR, GroupDrop(prompt_id=prompt_id, reason=f"gone: {exc}"), prompt_id=prompt_id)
            return
        if outcome.buffer_id is None:
            self.send(COORDINATOR, GroupDrop(prompt_id=prompt_id, reason="no_room"), prompt_id=prompt_id)
        else:
            slot = self.ledger.occupied_groups(outcome.buffer_id).index(prompt_id)
            self._occupied(
                Occupy(
                    prompt_id=prompt_id,
                    version=-1 if version is None else version,
                    from_buffer=-1 if reserved is None else reserved,
                    buffer=outcome.buffer_id,
                    slot=slot,
                )
            )
        for aborted in outcome.aborted:
            self._group_aborted(aborted)
        if outcome.is_buffer_ready and outcome.buffer_id is not None and not self.truncating:
            self._buffer_ready(outcome.buffer_id)
        self.core.notify_ledger_changed()
        self.maybe_filter()

    def _occupied(self, occupy: Occupy) -> None:
        self.send(COORDINATOR, occupy, prompt_id=occupy.prompt_id)

    def _buffer_ready(self, buffer: int) -> None:
        self.send(COORDINATOR, BufferReady(buffer=buffer, prompt_ids=self.ledger.occupied_groups(buffer)))

    def _on_group_drop(self, drop: GroupDrop, now: float) -> None:
        if self.is_copy(drop):
            return
        reason = _ABORT_REASONS.get(drop.reason, AbortReason.CANCELLED)
        aborted = self.ledger.abort_group(drop.prompt_id, reason)
        self._log_op("abort_group", drop.prompt_id, -1, reason.name, describe_abort(aborted))
        if aborted is not None:
            self._abort_children(aborted.prompt_id, [ref.child for ref in aborted.children_to_abort], "group")
        self.core.notify_ledger_changed()

    def _on_consume(self, consume: Consume, now: float) -> None:
        if self.is_copy(consume):
            return
        try:
            consumed = self.ledger.consume(consume.buffer)
        except LedgerError as exc:
            self._log_op("consume", consume.buffer, -1, "", f"error: {type(exc).__name__}: {exc}")
            if self.log is not None:
                self.log.error("consume refused", buffer=consume.buffer, error=str(exc))
            return
        self._log_op("consume", consume.buffer, -1, "", describe_consume(consumed))
        values = {f"staleness/count_{k}": float(v) for k, v in consumed.staleness_histogram.items()}
        values["staleness/bound_violations"] = float(consumed.num_bound_violations)
        self.publish(Metrics(step=consume.buffer, values=values))
        self.core.notify_ledger_changed()
        self.maybe_filter()

    # ------------------------------------------------------------------ the proactive filter

    def maybe_filter(self) -> None:
        """The proactive filter acts on the buffer the trainer is waiting for (its version exists)."""
        method = self.proactive.method
        if method is None or not self.filter_allowed() or self.truncating:
            return
        buffer = self.ledger.next_buffer_id
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
                self._occupied(
                    Occupy(
                        prompt_id=prompt_id,
                        version=-1 if version is None else version,
                        from_buffer=-1,
                        buffer=outcome.buffer_id,
                        slot=slot,
                    )
                )
        if outcome.num_fresh_prompts:
            self.send(COORDINATOR, Refill(num_groups=outcome.num_fresh_prompts, reason="retry"))
        if outcome.is_buffer_ready:
            self._buffer_ready(outcome.buffer_id)

    def _after_truncate(self, outcome: TruncateOutcome) -> None:
        for group, occupancy in zip(outcome.groups, outcome.occupancies, strict=True):
            self._abort_children(group.prompt_id, [ref.child for ref in group.surplus], "surplus")
            if occupancy.buffer_id is None:
                continue
            slot = self.ledger.occupied_groups(occupancy.buffer_id).index(group.prompt_id)
            version = self.ledger.group_version(group.prompt_id)
            occupy = Occupy(
                prompt_id=group.prompt_id,
                version=-1 if version is None else version,
                from_buffer=-1,
                buffer=occupancy.buffer_id,
                slot=slot,
            )
            winners = [group.prompt_id * self.n_per_prompt + c for c in group.winners]
            done = GroupFinished(prompt_id=group.prompt_id, request_ids=winners, occupied_buffer=occupancy.buffer_id)
            children = {ref.child for ref in group.truncated}
            if children:
                self.truncating[group.prompt_id] = (children, occupy, done)
                self._abort_children(group.prompt_id, sorted(children), "truncate")
            else:
                self._announce_truncated(occupy, done)

    def _announce_truncated(self, occupy: Occupy, done: GroupFinished) -> None:
        """The winners (marked as already occupied, so the coordinator does not ask again), then the slot."""
        self.send(COORDINATOR, done, prompt_id=occupy.prompt_id)
        self._occupied(occupy)
        if self.ledger.is_ready(occupy.buffer) and not self.truncating:
            self._buffer_ready(occupy.buffer)

    # ------------------------------------------------------------------ giving groups up

    def _group_aborted(self, aborted: GroupAborted) -> None:
        """A group left the ledger: stop its children; a failed group's slot needs a fresh group.

        Stale and no-room groups are redundant work whose windows filled up: nothing replaces them.
        """
        reason = aborted.reason.name.lower()
        if aborted.reason is AbortReason.STALE:
            versions = [t.v_traj for t in self.tracker.live.values() if t.prompt_id == aborted.prompt_id]
            self.publish(
                VersionAborted(version=min(versions, default=-1), num_requests=len(aborted.children_to_abort)),
                prompt_id=aborted.prompt_id,
            )
        self._abort_children(aborted.prompt_id, [ref.child for ref in aborted.children_to_abort], reason)
        self.send(COORDINATOR, GroupDrop(prompt_id=aborted.prompt_id, reason=reason), prompt_id=aborted.prompt_id)
        if aborted.reason is AbortReason.FAILED:
            self.send(COORDINATOR, Refill(num_groups=1, reason=reason, prompt_ids=[aborted.prompt_id]))

    def _abort_children(self, prompt_id: int, children: list[int], reason: str) -> None:
        for child in children:
            self.abort_one(prompt_id * self.n_per_prompt + child, reason)

    def _log_op(self, op: str, prompt_id: int, child: int, reason: str, outcome: str) -> None:
        if self.record_decisions:
            self.publish(
                LedgerOp(op=op, prompt_id=prompt_id, child=child, reason=reason, outcome=outcome), prompt_id=prompt_id
            )
