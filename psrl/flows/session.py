"""The session scheduler's algorithm: multi-turn sessions, their environment steps, hang and continue.

A session is one trajectory (its request id) of many turns. The router reports each placed turn
(``TurnStarted``: the session is pinned to that instance, status ``generate``) and each finished
one (``TurnDone``: status ``env``); the flow asks its environment port for the step, and the step's
answer (``EnvStepDone``) becomes the next turn (``TurnNext`` to the router, routed sticky to the
session's instance) or the end (``SessionEnd``: the environment's reward, or why the session
failed). A session ends after ``env.max_turns`` turns at the latest.

With ``session_strategy.thunder_agent.enable`` every ``check_interval_in_ms`` the ThunderAgent
decision (``psrl.coordination.session.schedule_sessions``) runs over the instances' KV capacity
(their status reports) and the sessions' footprints: a hung session's next turn is held here
(hanging a session whose turn is generating marks it; it is hung when that turn ends, so no turn
is ever aborted) until a later tick continues it. Each tick with live sessions is published
(``SessionTick``) with its inputs, so ``psrl replay --check sessions`` re-runs it.

A turn the scheduler already has arrives again when the router restarted (its rebuild hands over a
first turn whose handover the dead router had logged): it is taken once; the next turn already sent
for it (``Session.last_next``) or the session's end (``ended``) is sent again, since the dead router
may have taken it with it. The router takes each turn and each end once.

A scheduler restarted within its launch continues the sessions its predecessor left, rebuilt from
the event log (``psrl.flows.session_recovery``: the rule per session is there); ``restore`` runs
once, before any message of the new scheduler is handled.

The environment is a port (``EnvRunner``): env worker processes in the actor, an in-process
runner in the in-process driver and tests. Its answers come back as ``EnvStepDone`` messages.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from bus.messages import (
    ActorExited,
    EnvStepDone,
    InstanceStatus,
    ScaleDecided,
    SessionEnd,
    SessionGone,
    SessionTick,
    TurnDone,
    TurnNext,
    TurnStarted,
)
from bus.schema import Message
from psrl.config import Config
from psrl.coordination.session import (
    InstanceCapacity,
    SessionDecision,
    SessionInfo,
    SessionTickLog,
    encode_session_tick,
    schedule_sessions,
)
from psrl.flows.base import Flow
from psrl.flows.effects import Effect, Handler, Timer
from psrl.flows.session_gateway import GatewayCalls
from psrl.flows.session_recovery import SessionRecovery
from psrl.gateway.resume import TurnLog
from psrl.gateway.sessions import Gateway

ROUTER = "router"
HELD_WAITS_KEPT = 65_536


class EnvRunner(Protocol):
    def submit(self, request_id: int, prompt_id: int, turn: int, actions: list[np.ndarray]) -> None:
        """Start the environment step answering ``actions[turn]``; its answer comes back as EnvStepDone."""
        ...

    def cancel(self, request_id: int) -> None:
        """The session is gone: its pending step's answer is not wanted."""
        ...


@dataclass
class Session:
    request_id: int
    prompt_id: int
    instance: str | None = None
    status: Literal["generate", "env"] = "generate"
    hang_state: Literal["running", "hung"] = "running"
    marked_for_hang: bool = False  # hang at the end of the turn now generating
    num_tokens: int = 0
    turn: int = 0
    actions: list[np.ndarray] = field(default_factory=list)
    held: TurnNext | None = None  # the next turn, held while the session is hung
    pin_next: str = ""  # continue_force_pin: the instance the next turn goes to, once
    last_next: TurnNext | None = None  # the last next turn sent, sent again if its turn comes again
    finish: int = 0  # how its last turn ended (FinishReason)
    call_job: int = 0  # an agent session: the gateway call waiting for the turn now generating
    agent_open: bool = False  # an agent session whose agent has opened it at the gateway (its agent runs)
    turn_log: TurnLog | None = None  # an agent session: its turns' observations, finishes, log-probs
    replaying: bool = False  # an agent session whose agent runs again: its calls meet the logged turns first
    agent_turn: int = 1  # an agent session: the session's turn its agent's next generating call asks for
    hung_since: float | None = None  # when it was hung (ThunderAgent's max_hang_s orders by it)
    held_since: float | None = None  # when its held next turn became ready (ready turns are continued first)

    def info(self, now: float = 0.0) -> SessionInfo:
        hung = self.hang_state == "hung" or self.marked_for_hang
        hung_for = 0.0 if self.hung_since is None else now - self.hung_since
        # a turn held since this very tick still counts as ready: the smallest positive wait
        waiting = 0.0 if self.held_since is None else max(now - self.held_since, 1e-9)
        return SessionInfo(
            str(self.request_id), self.instance, self.status, "hung" if hung else "running", self.num_tokens,
            hung_for_s=hung_for, waiting_s=waiting,
        )  # fmt: skip


class SessionFlow(GatewayCalls, Flow):
    BUS_KINDS = (InstanceStatus, ActorExited, ScaleDecided)

    def __init__(self, config: Config, env: EnvRunner, *, log: Any = None, gateway: Gateway | None = None) -> None:
        super().__init__()
        self.env = env
        self.gateway = gateway  # agent sessions: their calls come through the gateway (psrl.flows.session_gateway)
        self.answers: list[tuple[int, Any]] = []
        self.log = log
        self.settings = config.env
        self.thunder = config.psrl.rollout_coordination.session_strategy.thunder_agent
        self.sessions: dict[int, Session] = {}
        self.ended: dict[int, SessionEnd] = {}  # every session ended here, sent again if asked again
        self.capacity: dict[str, InstanceCapacity] = {}
        self.gone: set[str] = set()  # instances removed from the set (psrl scale): never back
        self.counters: Counter[str] = Counter()
        self.num_hung_s = 0.0  # session-seconds spent hung (summed over ticks)
        # how long ready turns waited for their session's continue (the most recent: memory stays bounded)
        self.held_waits: deque[float] = deque(maxlen=HELD_WAITS_KEPT)

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            TurnStarted: self._on_started,  # from the router: a turn was placed
            TurnDone: self._on_turn_done,  # from the router: a turn finished generating
            SessionGone: self._on_gone,  # from the router: the trajectory ended there
            EnvStepDone: self._on_env_step,  # from the environment port
            InstanceStatus: self._on_instance_status,
            ActorExited: self._on_exited,
            ScaleDecided: self._on_scaled,  # instances removed (psrl scale): no capacity to schedule on
        }

    def timers(self) -> list[Timer]:
        if not self.thunder.enable:
            return []
        return [Timer("sessions", self.thunder.check_interval_in_ms / 1000, self.tick)]

    @property
    def num_inflight(self) -> int:
        return len(self.sessions)

    # ------------------------------------------------------------------ restart

    def restore(self, recovery: SessionRecovery, now: float) -> list[Effect]:
        """Take over the sessions a dead scheduler left (the rule: ``psrl.flows.session_recovery``)."""
        self.ended.update(recovery.ended)
        for end in recovery.unconfirmed_ends.values():  # it may not have left the dead scheduler
            self.counters["restored_ends_resent"] += 1
            self.send(ROUTER, end, request_id=end.request_id)
        for restored in recovery.sessions.values():
            session = Session(restored.request_id, restored.prompt_id, restored.instance)
            session.status = "env" if restored.status == "env" else "generate"
            session.num_tokens, session.turn = restored.num_tokens, restored.turn
            session.actions, session.last_next = list(restored.actions), restored.last_next
            self.sessions[session.request_id] = session
            self.counters["restored_sessions"] += 1
            if restored.last_next is not None and not restored.next_placed:  # it may not have left the dead one
                self.counters["restored_turns_resent"] += 1
                self.send(ROUTER, restored.last_next, request_id=session.request_id, prompt_id=session.prompt_id)
            if self.gateway is not None:  # the agent's process died with the old scheduler: it runs again
                self.resume_agent(session, restored)
                continue
            if session.status != "env":
                continue
            if restored.answer is not None:
                self.counters["restored_answers"] += 1
                self._on_env_step(restored.answer, now)  # held or unsent: it goes on from exactly that answer
            else:
                self.counters["restored_steps_rerun"] += 1
                self.env.submit(session.request_id, session.prompt_id, session.turn, session.actions)
        return self.take()

    # ------------------------------------------------------------------ turns

    def _on_started(self, started: TurnStarted, now: float) -> None:
        session = self.sessions.setdefault(started.request_id, Session(started.request_id, started.prompt_id))
        session.instance = started.instance  # a re-routed turn (migration, lost instance) moves the pin
        session.status = "generate"
        session.num_tokens = started.num_tokens

    def _on_turn_done(self, done: TurnDone, now: float) -> None:
        if self._repeated(done):
            return
        if done.turn == 0:  # the first turn needs no history (its TurnStarted may have been missed)
            self.sessions.setdefault(done.request_id, Session(done.request_id, done.prompt_id))
        session = self.sessions.get(done.request_id)
        if session is None or len(session.actions) != done.turn:
            # the scheduler restarted (or the turn is unknown): the history to replay the episode is gone
            self.counters["unknown_turns"] += 1
            self._end(done.request_id, 0.0, 0.0, done.turn + 1, "session scheduler lost the session's history")
            return
        session.status, session.instance, session.num_tokens = "env", done.instance, done.num_tokens
        session.turn, session.finish = done.turn, done.finish_reason
        session.actions.append(np.asarray(done.token_ids, np.int32))
        if session.marked_for_hang:  # the turn boundary: a marked session is hung now
            session.marked_for_hang, session.hang_state, session.hung_since = False, "hung", now
        if self.gateway is not None:
            self.log_turn(session, done)
        if self.gateway is not None and done.turn > 0:
            self.answer_turn(session, done)  # the agent's call asked for this turn (its run started at turn 0)
            return
        self.env.submit(session.request_id, session.prompt_id, done.turn, session.actions)

    def _on_env_step(self, step: EnvStepDone, now: float) -> None:
        session = self.sessions.get(step.request_id)
        if self.gateway is not None and session is not None:  # the agent's run is over: its reward or error
            self.counters["env_failures"] += bool(step.error)
            self.agent_done(session, step.reward, step.acc, step.error or ("" if step.done else "agent gave no reward"))
            return
        if session is None or step.turn != session.turn or session.status != "env":
            self.counters["late_env_steps"] += 1
            return
        num_turns = session.turn + 1
        if step.error:
            self.counters["env_failures"] += 1
            self._end(session.request_id, 0.0, 0.0, num_turns, step.error)
        elif step.done or num_turns >= self.settings.max_turns:
            self._end(session.request_id, step.reward, step.acc, num_turns, "")
        else:
            observation = np.asarray(step.observation_token_ids, np.int32)
            session.num_tokens += len(observation)
            nxt = TurnNext(
                request_id=session.request_id,
                turn=num_turns,
                observation_token_ids=observation,
                max_tokens=self.settings.max_turn_tokens,
            )
            if session.hang_state == "hung":
                self.hold(session, nxt, now)
            else:
                self._send_turn(session, nxt)

    def _repeated(self, done: TurnDone) -> bool:
        """A turn already taken (a restarted router handed it over again): answer as before, once more."""
        end = self.ended.get(done.request_id)
        session = self.sessions.get(done.request_id)
        if end is None and (session is None or len(session.actions) <= done.turn):
            return False
        self.counters["repeated_turns"] += 1
        if end is not None:
            self.send(ROUTER, end, request_id=done.request_id, prompt_id=done.prompt_id)
        elif session is not None and session.last_next is not None and session.last_next.turn == done.turn + 1:
            self.send(ROUTER, session.last_next, request_id=done.request_id, prompt_id=done.prompt_id)
        return True  # otherwise its answer is still to come (the step runs, or the session is hung)

    def hold(self, session: Session, turn: TurnNext, now: float) -> None:
        """A hung session's next turn is ready: it waits here until a tick continues the session."""
        session.held, session.held_since = turn, now
        self.counters["turns_held"] += 1

    def _send_turn(self, session: Session, turn: TurnNext) -> None:
        if session.pin_next:
            turn, session.pin_next = _pinned(turn, session.pin_next), ""
        session.last_next = turn
        if session.turn_log is not None:
            session.turn_log.sent_turn(turn.turn)
        self.send(ROUTER, turn, request_id=session.request_id, prompt_id=session.prompt_id)

    def _end(self, request_id: int, reward: float, acc: float, num_turns: int, error: str) -> None:
        self.close_call(request_id, error or "finished")
        session = self.sessions.pop(request_id, None)
        end = SessionEnd(request_id=request_id, reward=reward, acc=acc, num_turns=num_turns, error=error)
        self.ended[request_id] = end
        prompt_id = session.prompt_id if session is not None else None
        self.send(ROUTER, end, request_id=request_id, prompt_id=prompt_id)
        if error and self.log is not None:
            self.log.warning("session failed", request_id=request_id, error=error)

    def _on_gone(self, gone: SessionGone, now: float) -> None:
        self.close_call(gone.request_id, gone.reason or "ended by the router")
        if self.sessions.pop(gone.request_id, None) is not None:
            self.env.cancel(gone.request_id)

    # ------------------------------------------------------------------ instances

    def _on_instance_status(self, status: InstanceStatus, now: float) -> None:
        if status.instance in self.gone:
            return
        total = status.kv_capacity_tokens
        used = total * status.kv_blocks_used / status.kv_blocks_total if status.kv_blocks_total else 0.0
        self.capacity[status.instance] = InstanceCapacity(status.instance, total, used)

    def _on_exited(self, exited: ActorExited, now: float) -> None:
        self.capacity.pop(exited.actor, None)  # a restarted instance reports again

    def _on_scaled(self, decided: ScaleDecided, now: float) -> None:
        """A retiring instance leaves the capacity view at once; its later reports do not bring it back."""
        for name in [] if decided.error else decided.removed:
            self.capacity.pop(name, None)
            self.gone.add(name)

    # ------------------------------------------------------------------ ThunderAgent

    def tick(self, now: float) -> list[Effect]:
        """One hang/continue decision over the live sessions (recorded for replay)."""
        if not self.sessions:
            return []
        instances = sorted(self.capacity.values(), key=lambda c: c.instance_id)
        # an agent session is scheduled once its agent runs (opened it): before, it waits for a worker,
        # and hanging it would only keep the running agents hung (their workers held) for good
        live = [s for s in self.sessions.values() if self.gateway is None or s.agent_open]
        infos = [s.info(now) for s in sorted(live, key=lambda s: s.request_id)]
        decision = schedule_sessions(instances, infos, self.thunder)
        self._apply(decision, now)
        self.num_hung_s += (
            sum(s.hang_state == "hung" for s in self.sessions.values()) * self.thunder.check_interval_in_ms / 1000
        )
        record = encode_session_tick(SessionTickLog(instances, infos, decision))
        hung, continued = [int(s) for s in decision.hang], [int(o.session_id) for o in decision.resume]
        self.publish(SessionTick(hung=hung, continued=continued, record=record))
        return self.take()

    def _apply(self, decision: SessionDecision, now: float) -> None:
        for session_id in decision.hang:
            session = self.sessions[int(session_id)]
            self.counters["hangs"] += 1
            if session.status == "env":
                session.hang_state, session.hung_since = "hung", now  # idle at its environment: hung at once
            else:
                session.marked_for_hang = True  # generating: hung when the turn ends
        for order in decision.resume:
            session = self.sessions[int(order.session_id)]
            self.counters["continues"] += 1
            session.hang_state, session.marked_for_hang, session.hung_since = "running", False, None
            session.pin_next = order.instance_id if order.force_pin else ""
            held, session.held = session.held, None
            if held is not None:
                if session.held_since is not None:
                    self.held_waits.append(now - session.held_since)
                session.held_since = None
                self._send_turn(session, held)


def _pinned(turn: TurnNext, instance: str) -> TurnNext:
    return TurnNext(
        request_id=turn.request_id,
        turn=turn.turn,
        observation_token_ids=turn.observation_token_ids,
        max_tokens=turn.max_tokens,
        force_pin_instance=instance,
    )
