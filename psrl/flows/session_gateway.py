"""Agent sessions in the session scheduler: the gateway's calls become the router's turns.

With an agent (``agent.entry`` or ``agent.command``) a session's environment is the agent itself,
run once per session in an env worker from its first turn on. The agent talks to the gateway; each
call reaches the flow as a job (``gateway_job``: open, chat, completion, get, delete) and its answer
goes to ``answers`` (job id, result or ``ApiError``) for the actor to hand back to the HTTP thread.

* **open**: the runner opens the session of a trajectory whose first turn the router generated
  from the row's prompt; that turn becomes the session's first TITO turn (``Gateway.seed``).
* **chat / completion**: a recorded turn is answered at once; a new one is sent to the router as
  the next turn (``TurnNext``: the new messages' tokens as the observation, sticky to the session's
  instance, pinned to its version), held while the session is hung (ThunderAgent: the call simply
  waits), and answered when its ``TurnDone`` comes (``answer_turn``). A call that edits the history
  (a branch) is sent as a cut: ``TurnNext.cut_to`` (and ``prompt_keep``, a branch inside the row's
  prompt) cuts the router's trajectory back to the longest common token prefix and the observation is
  the rest of the call's prompt (``psrl.gateway.branch``).
  Turns are numbered per session (the router's), whatever trajectory of the TITO record they are on.
* The agent's end (its ``EnvStepDone``) ends the session with its reward or error; a session that
  ends otherwise (the router's ``SessionGone``: surplus, staleness, failure) answers its pending
  call with a 409 the agent treats as cancellation.

An agent that runs again (its env worker died, or the whole scheduler did and its replacement
rebuilt the session from the event log: ``resume_agent``) opens its session anew; its calls then
meet the turns the session already has by the resume rule (``psrl.gateway.resume``): a logged turn
is answered from the log, one still generating is waited for, one never sent is sent, and past them
the calls are new turns. No turn reaches the router twice. A call still waiting when its agent is
replaced gets a retryable 503 (its client is gone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from bus.messages import EnvStepDone, SessionEnd, TurnDone, TurnNext
from psrl.flows.session_recovery import RestoredSession
from psrl.gateway.api import ApiError
from psrl.gateway.branch import NO_CUT, Cut, CutPoint
from psrl.gateway.replies import finish_name
from psrl.gateway.resume import ResumeDivergedError, Step, TurnLog, place
from psrl.gateway.sessions import Answer, Gateway, Order


class GatewayCalls:
    """Mixed into ``SessionFlow`` (it provides sessions, env, counters, settings, _send_turn and _end)."""

    gateway: Gateway | None
    answers: list[tuple[int, Any]]
    sessions: dict[int, Any]
    ended: dict[int, SessionEnd]
    counters: Any
    settings: Any
    env: Any
    log: Any

    if TYPE_CHECKING:  # SessionFlow's and Flow's own (declared only for the type checker: never shadowed)

        def _send_turn(self, session: Any, turn: TurnNext) -> None: ...

        def hold(self, session: Any, turn: TurnNext, now: float) -> None: ...

        def publish(self, message: Any, **ids: Any) -> None: ...

        def _end(self, request_id: int, reward: float, acc: float, num_turns: int, error: str) -> None: ...

    def gateway_job(self, job_id: int, op: str, sid: str, payload: Any, now: float) -> None:
        """One call from the gateway's HTTP thread; its answer goes to ``answers`` (maybe later)."""
        try:
            result = self._job(job_id, op, sid, payload, now)
        except ApiError as error:
            self.counters[f"gateway_errors_{error.status}"] += 1
            result = error
        if result is not None:
            self.answers.append((job_id, result))

    def _job(self, job_id: int, op: str, sid: str, payload: Any, now: float) -> Any:
        gateway = self._gateway()
        if op == "open":
            return self._open(gateway, payload)
        if op == "get":
            return gateway.record(sid)
        if op == "delete":
            return self._delete(gateway, sid)
        if op in ("chat", "completion"):
            return self._call(gateway, job_id, sid, payload, now)
        raise ApiError(404, f"no operation {op}")

    def _gateway(self) -> Gateway:
        if self.gateway is None:
            raise ApiError(503, "this run has no agent sessions (agent.entry or agent.command)")
        return self.gateway

    def _open(self, gateway: Gateway, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("request_id"), int):
            raise ApiError(400, "POST /sessions needs the trajectory's request_id (the runner opens sessions)")
        session = self.sessions.get(body["request_id"])
        if session is None or not session.actions:
            raise ApiError(404, f"no session {body['request_id']} waiting for its agent", code="session_not_found")
        sid = str(session.request_id)
        if session.agent_open:  # its agent runs again (its env worker died): its calls meet the turns so far
            self._agent_rerun(gateway, session)
        gateway.open(sid)
        prompt = [int(t) for t in body.get("prompt_token_ids", [])]
        first = session.actions[0].tolist()
        turns = self._turn_log(session)
        try:
            messages, tools = body.get("messages", []), body.get("tools", [])
            gateway.seed(sid, messages, tools, prompt, first, finish_name(turns.finishes[0]), turns.logprobs[0])
        except ApiError:
            gateway.forget(sid)
            raise
        session.agent_open, session.agent_turn = True, 1
        return {"id": sid, "object": "session"}

    def _agent_rerun(self, gateway: Gateway, session: Any) -> None:
        self.counters["agents_rerun"] += 1
        if session.call_job:  # the dead agent's call: its client is gone, a retry would come to the new agent
            retry = ApiError(503, f"session {session.request_id}: its agent was restarted", code="agent_restarted")
            self.answers.append((session.call_job, retry))
            session.call_job = 0
        gateway.forget(str(session.request_id))
        session.replaying = True

    def _turn_log(self, session: Any) -> TurnLog:
        if session.turn_log is None:  # the first turn's TurnDone came before a log existed (it always makes one)
            session.turn_log = TurnLog([[]], [True], [int(session.finish)], [None])
        return cast(TurnLog, session.turn_log)

    def log_turn(self, session: Any, done: TurnDone) -> None:
        """A turn of an agent session came: its finish and log-probs kept (the agent's replay reads them)."""
        logprobs = None if done.logprobs is None else np.asarray(done.logprobs, np.float64).tolist()
        if done.turn == 0:
            session.turn_log = TurnLog([[]], [True])
        self._turn_log(session).generated(int(done.finish_reason), logprobs)

    def resume_agent(self, session: Any, restored: RestoredSession) -> None:
        """A session rebuilt from the log by a restarted scheduler: its agent runs again from the start."""
        if not session.actions:  # its first turn still generates: the agent starts when it comes
            return
        final = restored.answer
        if final is not None and (final.done or final.error):  # the agent had ended; its end was not sent
            self.agent_done(session, final.reward, final.acc, final.error)
            return
        observations = [[], *(o.tolist() for o in restored.observations)]
        cuts: list[CutPoint | None] = [NO_CUT, *restored.cuts]
        sent = [True] * len(observations)
        if final is not None:  # its call's tokens were logged, the turn not sent (its cut: not logged)
            observations.append(np.asarray(final.observation_token_ids).tolist())
            cuts.append(None)
            sent.append(False)
        session.turn_log = TurnLog(observations, sent, list(restored.finishes), list(restored.logprobs), cuts)
        session.replaying = True
        self.counters["agents_resumed"] += 1
        self.env.submit(session.request_id, session.prompt_id, 0, session.actions[:1])

    def _call(self, gateway: Gateway, job_id: int, sid: str, call: Any, now: float) -> Any:
        session = self.sessions.get(int(sid)) if sid.isdigit() else None
        if session is None:
            raise ApiError(404, f"no session {sid}", code="session_not_found")
        outcome = gateway.call(sid, call)
        if isinstance(outcome, Answer):
            return outcome
        if session.replaying:
            met, answer = self._resume_call(gateway, session, job_id, outcome, now)
            if met:
                return answer
        if session.turn + 1 >= self.settings.max_turns:
            gateway.failed(sid)
            raise ApiError(
                409, f"session {sid} used its env.max_turns={self.settings.max_turns} turns", code="max_turns"
            )
        session.call_job = job_id
        cut = _cut_of(outcome)
        observation = np.asarray(cut.observation, np.int32)
        # logged as the environment's answer to the last turn (the agent answered it with this call),
        # so the event log alone shows each turn's observation, as for any session
        self.publish(EnvStepDone(request_id=session.request_id, turn=session.turn, observation_token_ids=observation))
        nxt = self._next(session, outcome)
        self._turn_log(session).asked(nxt.turn, observation.tolist(), cut.point)
        session.agent_turn = nxt.turn + 1
        self._count_cut(session, nxt)
        session.num_tokens += len(cut.observation) - cut.num_cut
        self._send_or_hold(session, nxt, now)
        return None

    def _count_cut(self, session: Any, nxt: TurnNext) -> None:
        if nxt.cut_to < 0:
            return
        self.counters["branches"] += 1
        self.counters["branch_tokens_cut"] += nxt.num_cut
        if self.log is not None:
            self.log.info("agent session branched", request_id=session.request_id, turn=nxt.turn,
                          cut_to=nxt.cut_to, prompt_keep=nxt.prompt_keep, num_cut=nxt.num_cut)  # fmt: skip

    def _resume_call(self, gateway: Gateway, session: Any, job_id: int, outcome: Order, now: float) -> tuple[bool, Any]:
        """A re-run agent's call met with the session's logged turns: (met, its answer or None to wait)."""
        step = self._resume_step(gateway, session, outcome)
        if step == "new":
            session.replaying = False  # past the log: from here on its calls are new turns
            return False, None
        turn, cut = session.agent_turn, _cut_of(outcome)
        session.agent_turn += 1
        if self.log is not None:
            self.log.info("agent call met a logged turn", request_id=session.request_id, turn=turn, step=step)
        if step == "replay":
            return True, self._replayed(gateway, session, turn, cut)
        session.call_job = job_id  # wait: the turn generates; send: its call is logged, the turn not sent
        self.counters["turns_awaited" if step == "wait" else "turns_resent"] += 1
        if step == "send":
            session.num_tokens += len(cut.observation) - cut.num_cut
            nxt = self._next(session, outcome)
            self._count_cut(session, nxt)
            self._send_or_hold(session, nxt, now)
        return True, None

    def _next(self, session: Any, outcome: Order) -> TurnNext:
        cut = _cut_of(outcome)
        return TurnNext(
            request_id=session.request_id,
            turn=session.turn + 1,
            observation_token_ids=np.asarray(cut.observation, np.int32),
            max_tokens=outcome.max_tokens,
            cut_to=cut.cut_to,
            num_cut=cut.num_cut,
            prompt_keep=cut.prompt_keep,
        )

    def _send_or_hold(self, session: Any, nxt: TurnNext, now: float) -> None:
        if session.hang_state == "hung":
            self.hold(session, nxt, now)  # answered once a later tick continues the session
        else:
            self._send_turn(session, nxt)

    def _resume_step(self, gateway: Gateway, session: Any, outcome: Order) -> Step:
        sid, cut = str(session.request_id), _cut_of(outcome)
        try:
            turns, num_generated = self._turn_log(session), len(session.actions)
            return place(turns, sid, session.agent_turn, cut.observation, num_generated, cut.point)
        except ResumeDivergedError as exc:
            gateway.failed(sid)
            self.counters["agents_diverged"] += 1
            self._end(session.request_id, 0.0, 0.0, session.turn + 1, str(exc))
            raise ApiError(409, str(exc), code="history_diverged") from exc

    def _replayed(self, gateway: Gateway, session: Any, turn: int, cut: Cut) -> Answer:
        """A turn the session already has, asked again by its re-run agent: answered from the log."""
        self.counters["turns_replayed"] += 1
        turns = self._turn_log(session)
        turns.asked(turn, list(cut.observation), cut.point)  # kept where the log had it not (a no-op where it had)
        turns.sent_turn(turn)
        tokens = session.actions[turn].tolist()
        finish = finish_name(turns.finishes[turn])
        return gateway.generated(str(session.request_id), tokens, finish, turns.logprobs[turn])

    def answer_turn(self, session: Any, done: TurnDone) -> None:
        """A turn the agent asked for is generated: its call's answer."""
        gateway = self._gateway()
        job, session.call_job = session.call_job, 0
        if not job:  # no call waits for it (a re-run agent still replaying): its call gets it from the log
            return
        sid = str(session.request_id)
        try:
            logprobs = None if done.logprobs is None else np.asarray(done.logprobs, np.float64).tolist()
            tokens = np.asarray(done.token_ids).tolist()
            answer: Any = gateway.generated(sid, tokens, finish_name(done.finish_reason), logprobs)
        except ApiError as error:
            answer = error
        self.answers.append((job, answer))

    def agent_turn(self, request_id: int, turn: int) -> int:
        """The turn an agent's final answer answers: the session's last (its run started at turn 0)."""
        session = self.sessions.get(request_id)
        return turn if self.gateway is None or session is None else int(session.turn)

    def agent_done(self, session: Any, reward: float, acc: float, error: str) -> None:
        self._end(session.request_id, reward, acc, session.turn + 1, error)

    def close_call(self, request_id: int, reason: str) -> None:
        """The session is over: its pending call gets a 409 (cancellation), its record goes."""
        if self.gateway is None:
            return
        session = self.sessions.get(request_id)
        job = getattr(session, "call_job", 0) if session is not None else 0
        if job and session is not None:
            self.answers.append((job, ApiError(409, f"session {request_id} ended: {reason}", code="session_ended")))
            session.call_job = 0
        self.gateway.forget(str(request_id))

    def _delete(self, gateway: Gateway, sid: str) -> dict[str, Any]:
        record = gateway.record(sid)
        gateway.close(sid)
        return {"id": sid, "object": "session.deleted", "deleted": True, "record": record}


def _cut_of(outcome: Order) -> Cut:
    """The turn's cut: the gateway's (a run's session), or none (the plan's new tokens appended)."""
    return outcome.cut if outcome.cut is not None else Cut(-1, list(outcome.plan.new_tokens))
