"""What a restarted session scheduler rebuilds from the run's event log (pure: events in, state out).

Everything a session's history holds is in the log: the router logs each turn it places
(``TurnStarted``) and each turn it hands over with its tokens (``TurnDone``) on its link; the
scheduler logs each environment answer (``EnvStepDone``, published) and what it sent back
(``TurnNext``, ``SessionEnd``); the router's ``SessionGone`` and ``TrajectoryDone`` end a session
on its side. Only this launch counts (the scheduler's launch; a resumed run starts with no
sessions). A log with gaps in that launch cannot be rebuilt from (``num_missing_events``).

The rule for a session alive at the crash (``RestoredSession``), by its last logged step:

* its turn is generating (``TurnStarted`` last): it waits for the router's ``TurnDone``, as before;
* its next turn was sent and the router had not placed it (``TurnNext`` last): it is sent again,
  since the message may have died with the scheduler (a killed process's queued sends are lost,
  though the sender logged them); the router takes each turn once, so a copy it already has is
  dropped there;
* it ended (``SessionEnd`` logged) and the router has not finished its trajectory (no
  ``TrajectoryDone`` or ``SessionGone`` after it): the end is sent again, for the same reason;
* its turn was handed over and its environment answer is logged, but neither the next turn nor
  the end was sent (the answer was held while the session was hung, or the scheduler died in
  between): the answer is handled now, so the session goes on from exactly that answer;
* its turn was handed over and no answer is logged (the step was queued or running in an env
  worker of the dead scheduler): the step is run again on a fresh worker, which rebuilds the
  episode by replaying the session's logged actions (the same replay as a dead env worker's step).

An agent session (the gateway's) is continued by re-running its agent, whose calls meet the
session's logged turns by the resume rule (``psrl.gateway.resume``); for that each session keeps
its turns' observations, finish reasons and log-probs too.

Every session starts running: hang decisions are not restored, the next ThunderAgent tick makes
them again. The router's messages that were already in the log when it was read are handled
here, so when the link delivers one of them too it is dropped (``seen_event_ids``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bus.gaps import GapTracker
from bus.messages import EnvStepDone, SessionEnd, SessionGone, TrajectoryDone, TurnDone, TurnNext, TurnStarted
from bus.schema import Event
from psrl.gateway.branch import CutPoint
from psrl.launches import launch_of

ROUTER_LINK = "router.link"
ROUTER_TO_SESSION = (TurnStarted, TurnDone, SessionGone)


@dataclass
class RestoredSession:
    request_id: int
    prompt_id: int
    instance: str | None = None
    status: str = "generate"  # generate: its turn runs at an instance; env: its turn was handed over
    turn: int = 0
    num_tokens: int = 0
    actions: list[np.ndarray] = field(default_factory=list)
    answer: EnvStepDone | None = None  # the logged environment answer to its last handed-over turn
    last_next: TurnNext | None = None  # the last next turn sent for it
    next_placed: bool = True  # False while the router has not logged placing last_next (TurnStarted)
    observations: list[np.ndarray] = field(default_factory=list)  # per next turn sent: its observation (turn 1 on)
    cuts: list[CutPoint] = field(default_factory=list)  # per next turn sent: its (cut_to, prompt_keep); NO_CUT: none
    finishes: list[int] = field(default_factory=list)  # per handed-over turn: how it ended (agent sessions' replay)
    logprobs: list[list[float] | None] = field(default_factory=list)  # per handed-over turn, where logged


@dataclass
class SessionRecovery:
    sessions: dict[int, RestoredSession] = field(default_factory=dict)  # alive at the crash, in order
    ended: dict[int, SessionEnd] = field(default_factory=dict)  # every session the scheduler ended
    unconfirmed_ends: dict[int, SessionEnd] = field(default_factory=dict)  # ends the router has not acted on
    seen_event_ids: set[str] = field(default_factory=set)  # the router's messages for the scheduler in the log
    num_missing_events: int = 0

    @property
    def num_answered(self) -> int:
        return sum(1 for s in self.sessions.values() if s.status == "env" and s.answer is not None)

    @property
    def num_rerun(self) -> int:
        return sum(1 for s in self.sessions.values() if s.status == "env" and s.answer is None)


def rebuild_sessions(events: Iterable[Event[Any]], launch: int) -> SessionRecovery:
    """The sessions a scheduler of ``launch`` left behind, from the log's events in order."""
    recovery = SessionRecovery()
    gaps = GapTracker()
    for event in events:
        if launch_of(event.envelope.incarnation) != launch:
            continue
        gaps.observe(event.envelope)
        if event.envelope.sender == ROUTER_LINK and isinstance(event.message, ROUTER_TO_SESSION):
            recovery.seen_event_ids.add(event.envelope.event_id)
        if isinstance(event.message, SessionEnd):
            recovery.ended[event.message.request_id] = event.message
            recovery.unconfirmed_ends[event.message.request_id] = event.message
        elif isinstance(event.message, (SessionGone, TrajectoryDone)):
            recovery.unconfirmed_ends.pop(event.message.request_id, None)
        _observe(recovery.sessions, event.message)
    recovery.num_missing_events = gaps.num_missing
    return recovery


def _observe(sessions: dict[int, RestoredSession], msg: Any) -> None:
    if isinstance(msg, TurnStarted):
        session = sessions.setdefault(msg.request_id, RestoredSession(msg.request_id, msg.prompt_id))
        session.instance, session.status, session.num_tokens = msg.instance, "generate", msg.num_tokens
        session.next_placed = True
    elif isinstance(msg, TurnDone):
        _turn_done(sessions, msg)
    elif isinstance(msg, EnvStepDone):
        answered = sessions.get(msg.request_id)
        if answered is not None and answered.status == "env" and msg.turn == answered.turn:
            answered.answer = msg
    elif isinstance(msg, TurnNext):
        continued = sessions.get(msg.request_id)
        if continued is not None and msg.turn == continued.turn + 1:
            continued.status, continued.answer, continued.last_next = "generate", None, msg
            continued.next_placed = False
            continued.num_tokens += len(msg.observation_token_ids) - msg.num_cut
            continued.observations.append(np.asarray(msg.observation_token_ids, np.int32))
            continued.cuts.append((msg.cut_to, msg.prompt_keep))
    elif isinstance(msg, (SessionEnd, SessionGone, TrajectoryDone)):
        sessions.pop(msg.request_id, None)


def _turn_done(sessions: dict[int, RestoredSession], done: TurnDone) -> None:
    """As the flow takes it (``SessionFlow._on_turn_done``); a turn out of order ended the session there."""
    if done.turn == 0:
        sessions.setdefault(done.request_id, RestoredSession(done.request_id, done.prompt_id))
    session = sessions.get(done.request_id)
    if session is None or len(session.actions) != done.turn:
        return
    session.status, session.instance, session.num_tokens = "env", done.instance, done.num_tokens
    session.turn, session.answer = done.turn, None
    session.actions.append(np.asarray(done.token_ids, np.int32))
    session.finishes.append(int(done.finish_reason))
    session.logprobs.append(None if done.logprobs is None else np.asarray(done.logprobs, np.float64).tolist())
