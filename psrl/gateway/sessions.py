"""The gateway's sessions: which call gets which tokens generated, and what it is answered (pure).

``Gateway`` is driven by whoever generates (the session scheduler through the router, or an engine
in process): ``call`` places a chat call on its session's TITO record and returns either the
answer (a recorded turn, answered again) or an ``Order`` to generate; ``generated`` turns the
engine's tokens into the answer of the pending call. One call per session at a time (a second gets
429); a closing or ended session refuses calls (409, 404 once forgotten).

A training run's session is one router trajectory (``one_trajectory``): a call that does not
continue the session's current trajectory (the one its last generated turn is on) is sent as a cut
of that trajectory back to the longest common token prefix (``psrl.gateway.branch``, ``Order.cut``),
inside the row's prompt too (the router's trajectory then has a shorter prompt of its own, which the
session's next cuts are measured from); the TITO record keeps both trajectories, the router only the
branch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from psrl.gateway.api import ApiError, ChatCall, CompletionCall
from psrl.gateway.branch import BranchRefusedError, Cut, plan_cut
from psrl.gateway.chat_templates import ChatTemplate
from psrl.gateway.replies import Reply, make_reply, usage
from psrl.gateway.tito import Decode, Encode, Plan, TitoError, TitoSession, Turn
from psrl.gateway.tool_calls import parser_for


@dataclass(frozen=True)
class Settings:
    max_trim_tokens: int = 0
    tool_parser: str = "auto"
    max_turn_tokens: int = 256  # a call's max_tokens is capped here
    context_tokens: int = 4096  # a prompt longer than this is refused (413)
    one_trajectory: bool = False  # a run's session is one router trajectory: an edited history cuts it back
    max_top_logprobs: int = 0  # alternatives per token the generator returns (a call asking more: 400)


@dataclass(frozen=True)
class Answer:
    reply: Reply
    usage: dict[str, int]
    turn: int
    text: str  # the whole turn decoded without special tokens (completions answer this)
    logprobs: list[float] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    top_logprobs: list[list[tuple[str, float]]] = field(default_factory=list)  # per token: (text, log-prob)
    engine_ms: float = 0.0  # the engine's time for this turn, where the generator measures it


@dataclass(frozen=True)
class Order:
    """Generate ``new_tokens`` after the trajectory's tokens (``plan.prompt`` in all), up to ``max_tokens``."""

    session_id: str
    plan: Plan
    max_tokens: int
    cut: Cut | None = None  # one_trajectory: what the router's trajectory does before generating


@dataclass
class _Pending:
    plan: Plan
    call: ChatCall | CompletionCall
    cut: Cut | None = None


@dataclass
class GatewaySession:
    session_id: str
    tito: TitoSession
    state: Literal["open", "closing"] = "open"
    pending: _Pending | None = None
    num_calls: int = 0
    current: int = 0  # the trajectory of the last generated turn (the router's, in a run)
    prompt_len: int = 0  # the router trajectory's prompt tokens: the row's, or fewer after a branch inside it


class Gateway:
    def __init__(
        self, template: ChatTemplate, encode: Encode, decode: Decode, text: Decode, settings: Settings
    ) -> None:
        self.template, self.encode, self.decode, self.text = template, encode, decode, text
        self.settings = settings
        self.parser = parser_for(template.family, settings.tool_parser)
        self.sessions: dict[str, GatewaySession] = {}

    def open(self, session_id: str) -> GatewaySession:
        if session_id in self.sessions:
            raise ApiError(409, f"session {session_id} is already open")
        tito = TitoSession(
            session_id, self.template, self.encode, self.decode, self.settings.max_trim_tokens, self.text
        )
        session = self.sessions[session_id] = GatewaySession(session_id, tito)
        return session

    def seed(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        prompt: list[int],
        generated: list[int],
        finish: str,
        logprobs: list[float] | None = None,
    ) -> None:
        """The session's first turn was generated ahead of any call (the run's prompt path)."""
        session = self._session(session_id)
        if self.decode(prompt) != self.template.render(messages, tools, True):
            raise ApiError(400, f"session {session_id}: the row's messages do not render to the run's prompt tokens")
        reply = make_reply(self.text(generated), finish, self.parser, [], f"call-{session_id}-0")
        session.current, session.prompt_len = 0, len(prompt)
        session.tito.seed(messages, tools, prompt, generated, reply.canonical, reply.finish_reason, logprobs)

    def call(self, session_id: str, call: ChatCall | CompletionCall) -> Answer | Order:
        session = self._session(session_id)
        if session.state != "open":
            raise ApiError(409, f"session {session_id} is ending", code="session_closing")
        if session.pending is not None:
            raise ApiError(429, f"session {session_id} already has a call in flight", code="session_busy")
        self._check_logprobs(call)
        plan = self._plan(session, call)
        if plan.kind == "recorded":
            traj = session.tito.trajectories[plan.trajectory]
            return self._answer(session, call, traj.turns[plan.turn], plan)
        cut = self._cut(session, plan)
        if len(plan.prompt) >= self.settings.context_tokens:
            raise ApiError(
                413,
                f"the prompt is {len(plan.prompt)} tokens; the model's context is {self.settings.context_tokens}",
                code="context_length_exceeded",
            )
        session.pending = _Pending(plan, call, cut)
        session.num_calls += 1
        room = self.settings.context_tokens - len(plan.prompt)
        return Order(
            session_id,
            plan,
            min(call.max_tokens or self.settings.max_turn_tokens, self.settings.max_turn_tokens, room),
            cut,
        )

    def _cut(self, session: GatewaySession, plan: Plan) -> Cut | None:
        """A run's session: how its one trajectory goes on to the plan's prompt (a cut on a branch)."""
        if not self.settings.one_trajectory or not session.tito.trajectories:
            return None
        if plan.kind == "continue" and plan.trajectory == session.current:  # the common case: no cut
            return Cut(-1, list(plan.new_tokens))
        current = session.tito.trajectories[session.current]
        where = f"session {session.session_id} turn {plan.turn}"
        try:
            mask = session.tito.prompt_mask(plan)
            return plan_cut(current.tokens, current.loss_mask, plan.prompt, mask, session.prompt_len, where)
        except BranchRefusedError as exc:  # no token in common: nothing to branch from
            raise ApiError(409, str(exc), code="history_edited") from exc

    def _check_logprobs(self, call: ChatCall | CompletionCall) -> None:
        wanted = call.top_logprobs if isinstance(call, ChatCall) else 0
        if wanted > self.settings.max_top_logprobs:
            where = (
                f"at most {self.settings.max_top_logprobs} alternatives per token"
                if self.settings.max_top_logprobs
                else "no alternatives per token (only each generated token's own log-prob: logprobs=true)"
            )
            message = f"'top_logprobs' is {wanted}; this gateway's engine returns {where}"
            raise ApiError(400, message, param="top_logprobs")

    def _plan(self, session: GatewaySession, call: ChatCall | CompletionCall) -> Plan:
        try:
            if isinstance(call, ChatCall):
                return session.tito.plan(call.messages, call.tools)
            return session.tito.plan_text(call.prompt)
        except TitoError as exc:
            raise ApiError(409, str(exc), code="tito_trim_exceeded") from exc
        except ValueError as exc:  # the template refused the conversation
            raise ApiError(400, str(exc), param="messages") from exc

    def generated(
        self,
        session_id: str,
        tokens: list[int],
        finish: str,
        logprobs: list[float] | None = None,
        top_logprobs: list[list[tuple[int, float]]] | None = None,
    ) -> Answer:
        """The engine's tokens for the session's pending call: recorded, and its answer."""
        session = self._session(session_id)
        pending, session.pending = session.pending, None
        if pending is None:
            raise ApiError(409, f"session {session_id} has no call waiting for tokens")
        call = pending.call
        stop = call.stop if isinstance(call, ChatCall | CompletionCall) else []
        reply = make_reply(
            self.text(tokens), finish, self._parser(call), stop, f"call-{session_id}-{pending.plan.turn}"
        )
        turn = session.tito.record(pending.plan, tokens, reply.canonical, reply.finish_reason, logprobs)
        turn.top_logprobs = top_logprobs
        session.current = pending.plan.trajectory
        if pending.cut is not None and pending.cut.prompt_keep >= 0:  # the router's prompt was cut with it
            session.prompt_len = pending.cut.prompt_keep
        return self._answer(session, call, turn, pending.plan)

    def failed(self, session_id: str) -> None:
        """The pending call's generation failed (its answer is an error): the session takes calls again."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.pending = None

    def _answer(
        self,
        session: GatewaySession,
        call: ChatCall | CompletionCall,
        turn: Turn,
        plan: Plan,
    ) -> Answer:
        text = self.text(turn.generated)
        reply = make_reply(
            text,
            turn.finish_reason if turn.finish_reason != "tool_calls" else "stop",
            self._parser(call),
            call.stop,
            f"call-{session.session_id}-{plan.turn}",
        )
        want = isinstance(call, ChatCall) and call.logprobs
        if want and turn.logprobs is None:  # a generator that gave none, or a turn rebuilt without them
            raise ApiError(
                400,
                f"session {session.session_id} turn {plan.turn}: its log-probs are not known here; "
                "ask again without logprobs",
                param="logprobs",
            )
        pieces = [self.decode([t]) for t in turn.generated] if want else []
        top: list[list[tuple[str, float]]] = []
        if want and isinstance(call, ChatCall) and call.top_logprobs and turn.top_logprobs is not None:
            top = [[(self.decode([t]), lp) for t, lp in alts[: call.top_logprobs]] for alts in turn.top_logprobs]
        logprobs = list(turn.logprobs or []) if want else []
        return Answer(reply, usage(turn.prompt_len, len(turn.generated)), plan.turn, text, logprobs, pieces, top)

    def _parser(self, call: ChatCall | CompletionCall) -> str:
        return self.parser if isinstance(call, ChatCall) and call.use_tools and call.tools else "none"

    def close(self, session_id: str) -> bool:
        """End the session: its record is kept for GET until ``forget``; False when there is none."""
        session = self.sessions.get(session_id)
        if session is None:
            return False
        session.state = "closing"
        return True

    def forget(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def _session(self, session_id: str) -> GatewaySession:
        session = self.sessions.get(session_id)
        if session is None:
            raise ApiError(404, f"no session {session_id}", code="session_not_found")
        return session

    def record(self, session_id: str) -> dict[str, Any]:
        """The session's TITO record (``GET /sessions/{sid}``)."""
        session = self._session(session_id)
        return {
            "id": session_id,
            "state": session.state,
            "in_flight": session.pending is not None,
            "num_calls": session.num_calls,
            "current": session.current,
            "trajectories": [_trajectory(t) for t in session.tito.trajectories],
        }


def _trajectory(traj: Any) -> dict[str, Any]:
    turns = [
        {
            "prompt_tokens": t.prompt_len,
            "completion_tokens": len(t.generated),
            "finish_reason": t.finish_reason,
            "logprobs": t.logprobs,
        }
        for t in traj.turns
    ]
    return {
        "token_ids": list(traj.tokens),
        "loss_mask": list(traj.loss_mask),
        "turns": turns,
        "branch_of": traj.branch_of,
        "branch_at": traj.branch_at,
    }
