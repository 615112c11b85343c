"""What a restarted router rebuilds from the run's event log (pure: events in, state out).

The router's state is the staleness ledger, the trajectories it tracks and the coordinator's
commands it has handled. All three are in the log: the ledger as its logged calls
(``psrl.staleness.log_replay``, the very replay ``psrl replay --check ledger`` runs), the
trajectories as the coordinator's requests, the router's dispatches to instances (each with the
tokens it continued from), the instances' results, the router's aborts and the trajectories it
handed back (``TrajectoryDone``), and the commands as the coordinator's link traffic, each of
which names, as the ``parent`` of whatever the router logged while handling it, whether it was
handled.

A multi-turn session (``env.enable``) is rebuilt at the turn of the router's last dispatch
(``SessionPrefix``): its response before that turn is, turn by turn, the instance's finished result
of each earlier turn (the one the dead router handed over as ``TurnDone``: tokens, log-probs,
versions) and the environment's answer to it (the scheduler's ``TurnNext``: log-prob 0, untrained),
each branch's cut applied before its answer (``cut_to``; ``prompt_keep`` cuts the request's prompt
too); the dispatch's prompt must be exactly that prompt and that prefix. The current turn then
goes by the rule above (queued, its logged result handled, or recalled). When a turn finishes the
router hands it to the session scheduler again; the scheduler takes a turn it already has once and
answers it again with the next turn or end it had sent (``SessionFlow``), which the dead router
may have taken with it. A session whose prefix the log does not give exactly (a result missing,
or a dispatch whose prompt is not that prefix) is failed with the reason ``SESSION_NOT_REBUILT``:
its group is refilled like any failed trajectory's, and the scheduler is told to forget it.

Only this launch counts (a resumed run's router starts from its checkpoint): events whose
incarnation belongs to the router's launch. A log with gaps in that launch (the logger lost
events, e.g. it died too) cannot be rebuilt from: ``num_missing_events`` says so, and the actor
refuses to start rather than continue from a wrong ledger.

The rule for a trajectory alive at the crash (``RestoredRequest``), by its last logged step:

* never dispatched: queued again, as the coordinator sent it;
* dispatched, and its instance's result is in the log: that result is handled now (finished:
  counted in the ledger; interrupted: continued from its tokens), as the dead router would have;
* dispatched, no result yet: *recalled*: its instance is asked to hand it back (an interruption,
  ``router_restart``) and it continues from the tokens it returns, pinned to its V_traj, keeping
  its ledger reservation. If the instance does not answer (it no longer has the request), it is
  continued from the tokens of its last dispatch.

A finish the dead router counted in the ledger (its ``ledger.op finish`` is logged) but whose
``group.trajectory`` is not logged was never delivered: the router held it for an unreachable
coordinator and died with it. The rebuilt ledger already holds that finish, so the trajectory is
*owed* (``RestoredRequest.counted``): when it finishes in the new router (at once, from its logged
result, or after its recall) the coordinator gets the trajectory, and the group's winners if that
finish completed the group, without counting it in the ledger again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bus.gaps import GapTracker
from bus.messages import (
    Abort,
    ActorExited,
    Consume,
    GenerateRequest,
    GenerateResult,
    GroupAccept,
    GroupDrop,
    RoutingRecord,
    ScaleDecided,
    TrajectoryDone,
    TurnDone,
    TurnNext,
    WeightsPublished,
)
from bus.schema import Event
from psrl.evaluation.certificate import Derivation
from psrl.flows.once_each import OnceEach
from psrl.gateway.branch import cut_response
from psrl.launches import launch_of
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.log_replay import LedgerReplay
from psrl.staleness.types import FinishOutcome, FinishVerdict, LedgerSizes

ROUTER = "router"
COORDINATOR = "coordinator"
COMMANDS = (GroupAccept, GroupDrop, Consume, Abort)  # coordinator -> router, besides requests
COUNTED = (FinishVerdict.ACCEPTED, FinishVerdict.GROUP_COMPLETE)  # finishes the ledger counts
RECALL = "router_restart"  # the interruption a restarted router asks for to get a request back
SESSION = "session"
SESSION_NOT_REBUILT = "router restarted: the session's earlier turns are not in the log exactly"


@dataclass
class SessionPrefix:
    """A session's response before its current turn, as the dead router held it."""

    turn: int = 0  # the turn being generated (or handed over) at the crash
    turns: dict[int, GenerateResult] = field(default_factory=dict)  # each handed-over turn's finished result
    answers: dict[int, np.ndarray] = field(default_factory=dict)  # turn -> the environment's answer before it
    cuts: dict[int, int] = field(default_factory=dict)  # turn -> the response cut before its answer (a branch)
    prompt_keeps: dict[int, int] = field(default_factory=dict)  # turn -> the prompt cut before it (a branch inside it)
    exact: bool = True  # every dispatch's prompt was the request's prompt and this prefix
    handed: dict[int, np.ndarray] = field(default_factory=dict)  # turn -> the tokens handed over (TurnDone)
    results: list[GenerateResult] = field(default_factory=list)  # every result for it, any order

    def resolve(self, prompt: np.ndarray, dispatch: GenerateRequest | None) -> None:
        """Match each handed-over turn with the instance's result of those very tokens (the router's
        and the instances' events reach the log in any order), then find the last dispatch's turn."""
        for turn, tokens in self.handed.items():
            found = [r for r in self.results if np.array_equal(np.asarray(r.token_ids), tokens)]
            if not found:
                self.exact = False
                return
            self.turns[turn] = found[-1]
        if dispatch is None or not self.handed:
            return  # not a session, or in its first turn: the prompt is the request's
        current = self.turn_of(prompt, dispatch)
        if current is None:
            self.exact = False
        else:
            self.turn = current

    def arrays(self, upto: int, pinned: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(token ids, log-probs, versions, loss mask) of the response before turn ``upto``; a branch's
        cut (``TurnNext.cut_to``) applied before its answer, as the router applied it. An answer takes
        the version of the token before it, ``pinned`` (V_traj) where a cut left none."""
        ids, logprobs = np.zeros(0, np.int32), np.zeros(0, np.float32)
        versions, mask = np.zeros(0, np.int32), np.zeros(0, np.uint8)
        for turn in range(upto):
            result = self.turns[turn]
            ids = np.concatenate([ids, np.asarray(result.token_ids, np.int32)])
            logprobs = np.concatenate([logprobs, np.asarray(result.logprobs, np.float32)])
            versions = np.concatenate([versions, np.asarray(result.versions, np.int32)])
            mask = np.concatenate([mask, np.ones(len(result.token_ids), np.uint8)])
            if self.cuts.get(turn + 1, -1) >= 0:
                ids, logprobs, versions, mask = cut_response(ids, logprobs, versions, mask, self.cuts[turn + 1])
            last_version = int(versions[-1]) if len(versions) else pinned
            answer = self.answers[turn + 1]
            ids = np.concatenate([ids, np.asarray(answer, np.int32)])
            logprobs = np.concatenate([logprobs, np.zeros(len(answer), np.float32)])
            versions = np.concatenate([versions, np.full(len(answer), last_version, np.int32)])
            mask = np.concatenate([mask, np.zeros(len(answer), np.uint8)])
        return ids, logprobs, versions, mask

    def prompt_keep(self, upto: int) -> int:
        """The prompt tokens the session kept before turn ``upto`` (the last branch inside the prompt
        among turns 1..upto); -1: the request's whole prompt."""
        keeps = [self.prompt_keeps.get(turn, -1) for turn in range(1, upto + 1)]
        return next((keep for keep in reversed(keeps) if keep >= 0), -1)

    def prompt(self, request_prompt: np.ndarray, upto: int) -> np.ndarray:
        """The session's prompt at turn ``upto``: the request's, cut where a branch cut it."""
        keep = self.prompt_keep(upto)
        return request_prompt if keep < 0 else request_prompt[:keep]

    def turn_of(self, prompt: np.ndarray, dispatch: GenerateRequest) -> int | None:
        """The turn a dispatch generates: the one whose prompt and prefix it carries as its prompt
        (``prompt``: the request's)."""
        carried = np.asarray(dispatch.prompt_token_ids)
        for turn in range(len(self.turns) + 1):
            if turn > 0 and (turn - 1 not in self.turns or turn not in self.answers):
                return None
            expected = np.concatenate([self.prompt(np.asarray(prompt), turn), self.arrays(turn)[0]])
            if len(expected) == len(carried) and np.array_equal(expected, carried):
                return turn
        return None


@dataclass
class RestoredRequest:
    """A trajectory the dead router was tracking, as far as the log shows it."""

    request: GenerateRequest  # as the coordinator sent it
    dispatch: GenerateRequest | None = None  # the router's last dispatch of it
    instance: str = ""  # where that dispatch went
    result: GenerateResult | None = None  # the instance's result after that dispatch
    abort_reason: str | None = None  # an abort the router asked for after that dispatch
    flags: int = 0  # TrajectoryFlags so far, as the staleness certificate derives them
    result_instances: set[str] = field(default_factory=set)  # every instance that returned a result for it
    # the dead router's counted finish of it, whose group.trajectory it never delivered (it held it for an
    # unreachable coordinator): owed to the coordinator, with the group's winners if it completed the group
    counted: FinishOutcome | None = None
    session: SessionPrefix = field(default_factory=SessionPrefix)  # multi-turn sessions: the turns so far


@dataclass
class RouterRecovery:
    ledger: StalenessLedger
    requests: dict[int, RestoredRequest] = field(default_factory=dict)  # alive at the crash, in arrival order
    commands: list[Any] = field(default_factory=list)  # coordinator commands never handled, in log order
    seen_event_ids: set[str] = field(default_factory=set)  # every coordinator message logged so far
    # every request the coordinator is logged sending, every command the dead router handled
    taken: OnceEach = field(default_factory=OnceEach)
    ps_version: int = 0
    num_missing_events: int = 0  # sequence gaps in the launch's log: events the logger never got
    retiring: list[str] = field(default_factory=list)  # instances removed by psrl scale that had not exited

    @property
    def num_recalled(self) -> int:
        return sum(1 for r in self.requests.values() if r.dispatch is not None and r.result is None)


def actor_of(sender: str) -> str:
    """The actor behind an envelope's sender: ``router.link`` -> router, ``coordinator-router.link``
    -> coordinator, ``session-router.link`` -> session, ``rollout-0/hb`` -> rollout-0."""
    name = sender.split("/", 1)[0].split(".", 1)[0]
    return name.removesuffix(f"-{ROUTER}") if name in (f"{COORDINATOR}-{ROUTER}", f"{SESSION}-{ROUTER}") else name


def rebuild_router(events: Iterable[Event[Any]], sizes: LedgerSizes, launch: int) -> RouterRecovery:
    """Everything a router of ``launch`` left behind, from the log's events in order."""
    ledger = LedgerReplay(sizes)
    state = _Walk()
    derivation = Derivation()
    gaps = GapTracker()
    for event in events:
        outcome = ledger.observe(event)
        if launch_of(event.envelope.incarnation) == launch:
            gaps.observe(event.envelope)
            state.observe(event)
            if isinstance(outcome, FinishOutcome) and outcome.verdict in COUNTED:
                state.counted(outcome, sizes.redundant_rollout_n)
            derivation.observe(event.message, event.envelope.sender, event.envelope.incarnation, event.envelope.wall_ns)
    for rid, restored in state.requests.items():
        flags, instances = derivation.flags_so_far(rid)
        restored.flags, restored.result_instances = int(flags), instances
        restored.session.resolve(np.asarray(restored.request.prompt_token_ids, np.int32), restored.dispatch)
    recovery = RouterRecovery(
        ledger.current(), state.requests, seen_event_ids=state.seen, taken=state.taken, ps_version=state.ps_version,
        num_missing_events=gaps.num_missing, retiring=sorted(state.retiring),
    )  # fmt: skip
    recovery.commands = [e.message for e in state.commands if e.envelope.event_id not in state.handled]
    for command in (e.message for e in state.commands if e.envelope.event_id in state.handled):
        state.taken.take(command)  # those never handled are taken when the new router handles them
    return recovery


@dataclass
class _Walk:
    """The log walked in order. Events of different senders meet at the proxy in any order, so a
    request's dispatch, result or end can be logged before the coordinator's request itself: those
    wait (``early``) and are taken in order once the request is seen, and a request whose end came
    first is not alive."""

    requests: dict[int, RestoredRequest] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)  # requests the router handed back (TrajectoryDone)
    taken: OnceEach = field(default_factory=OnceEach)  # every request the coordinator sent
    early: dict[int, list[Event[Any]]] = field(default_factory=dict)  # events of requests not yet seen
    commands: list[Event[Any]] = field(default_factory=list)
    handled: set[str] = field(default_factory=set)  # coordinator messages the router logged something for
    seen: set[str] = field(default_factory=set)
    instance_of: dict[int, str] = field(default_factory=dict)  # request -> instance of its last routing record
    ps_version: int = 0
    retiring: set[str] = field(default_factory=set)  # removed by a scale request, not exited yet

    def observe(self, event: Event[Any]) -> None:
        env, msg = event.envelope, event.message
        actor = actor_of(env.sender)
        if self._is_early(actor, msg):
            self.early.setdefault(msg.request_id, []).append(event)
            return
        if isinstance(msg, WeightsPublished):
            self.ps_version = max(self.ps_version, msg.version)
        elif isinstance(msg, ScaleDecided) and msg.token and not msg.error:
            self.retiring.update(msg.removed)
        elif isinstance(msg, ActorExited):
            self.retiring.discard(msg.actor)
        elif actor == ROUTER:
            if env.parent is not None:
                self.handled.add(env.parent)
            self._from_router(msg)
        elif actor == COORDINATOR and env.sender.endswith(".link"):
            self.seen.add(env.event_id)
            self._from_coordinator(event)
        elif actor == SESSION and isinstance(msg, TurnNext) and msg.request_id in self.requests:
            self.requests[msg.request_id].session.answers[msg.turn] = np.asarray(msg.observation_token_ids)
            self.requests[msg.request_id].session.cuts[msg.turn] = msg.cut_to
            self.requests[msg.request_id].session.prompt_keeps[msg.turn] = msg.prompt_keep
        elif isinstance(msg, GenerateResult) and msg.request_id in self.requests:
            restored = self.requests[msg.request_id]
            restored.session.results.append(msg)
            if restored.dispatch is not None and restored.instance == msg.instance:
                restored.result = msg

    def counted(self, outcome: FinishOutcome, n_per_prompt: int) -> None:
        """The router counted a child's finish; until its ``group.trajectory`` is logged, it is owed."""
        restored = self.requests.get(outcome.prompt_id * n_per_prompt + outcome.child)
        if restored is not None:
            restored.counted = outcome

    def _is_early(self, actor: str, msg: Any) -> bool:
        """A request's own event (the router's dispatch, an instance's result) before its request."""
        about = isinstance(msg, GenerateResult) or (actor == ROUTER and isinstance(msg, GenerateRequest | TurnDone))
        rid = getattr(msg, "request_id", None)
        return about and rid is not None and rid not in self.requests and rid not in self.ended

    def _from_coordinator(self, event: Event[Any]) -> None:
        msg = event.message
        if isinstance(msg, GenerateRequest):
            self.taken.take(msg)
            if msg.request_id in self.ended or msg.request_id in self.requests:
                return  # handed back already: its end reached the log before the request
            self.requests[msg.request_id] = RestoredRequest(msg)
            for waiting in self.early.pop(msg.request_id, []):
                self.observe(waiting)
        elif isinstance(msg, COMMANDS):
            self.commands.append(event)

    def _from_router(self, msg: Any) -> None:
        if isinstance(msg, RoutingRecord):
            self.instance_of[msg.request_id] = msg.instance
        elif isinstance(msg, GenerateRequest) and msg.request_id in self.requests:
            restored = self.requests[msg.request_id]
            restored.dispatch = msg
            restored.instance = self.instance_of.get(msg.request_id, "")
            restored.result, restored.abort_reason = None, None
        elif isinstance(msg, Abort) and msg.reason != RECALL:  # a recall is not an end
            for rid in msg.request_ids:
                if rid in self.requests and self.requests[rid].dispatch is not None:
                    self.requests[rid].abort_reason = msg.reason or "requested"
        elif isinstance(msg, TrajectoryDone):
            self.requests.pop(msg.request_id, None)
            self.ended.add(msg.request_id)
            self.early.pop(msg.request_id, None)
        elif isinstance(msg, TurnDone) and msg.request_id in self.requests:
            self.requests[msg.request_id].session.handed[msg.turn] = np.asarray(msg.token_ids)
