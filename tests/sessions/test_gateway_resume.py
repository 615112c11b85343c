"""Agent sessions survive their agent's restart: a restarted session scheduler rebuilds them from the
event log and runs their agents again, whose calls meet the logged turns by the resume rule
(``psrl.gateway.resume``): logged turns are answered from the log, a turn still generating is
waited for, a logged but unsent one is sent, later calls are new turns; no turn reaches the router
twice, and a re-run agent that asks for other tokens fails its session naming session and turn."""

from __future__ import annotations

from typing import Any

import pytest

from bus.messages import EnvStepDone, SessionEnd, TurnNext, TurnStarted
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.session import SessionFlow
from psrl.flows.session_recovery import rebuild_sessions
from psrl.gateway.api import ApiError
from psrl.gateway.resume import ResumeDivergedError, TurnLog, place
from psrl.gateway.sessions import Answer
from tests.sessions.test_session_flow import sent, step, turn_done
from tests.sessions.test_session_gateway import ROW, chat, encode, make, opened
from tests.sessions.test_session_recovery import Log

RID = 8
TURN_TOKENS = {1: [*encode("because"), 1], 2: [*encode("yes"), 1], 3: [*encode("no"), 1]}


def history(flow: SessionFlow, upto: int) -> list[dict[str, Any]]:
    """The example agent's conversation for its call of turn ``upto`` (deterministic given the answers)."""
    messages = [*ROW]
    replies = {0: "ans 6", **{t: flow.gateway.text(TURN_TOKENS[t]) for t in TURN_TOKENS}}  # type: ignore[union-attr]
    for turn in range(upto):
        messages += [{"role": "assistant", "content": replies[turn]}, {"role": "user", "content": f"more {turn}"}]
    return messages


def logged(log: Log, effects: list[Effect]) -> None:
    """The scheduler's messages in the log, and the router placing each next turn it sends."""
    for effect in effects:
        if isinstance(effect, Publish):
            log.add("session", effect.message)
        elif isinstance(effect, Send):
            log.add("session-router.link", effect.message)
            if isinstance(effect.message, TurnNext):
                turn = effect.message.turn
                log.add("router.link", TurnStarted(request_id=RID, prompt_id=RID // 4, instance="i0", turn=turn,
                                                   num_tokens=10))  # fmt: skip


def from_router(log: Log, flow: SessionFlow, message: Any) -> list[Effect]:
    log.add("router.link", message)
    effects = flow.handle(message, 0.0)
    logged(log, effects)
    return effects


def first_run(generated_upto: int) -> tuple[Log, list[Any]]:
    """A first scheduler whose agent asked for turns 1..generated_upto+1; the last one still generates."""
    flow, _ = make()
    log = Log()
    log.add("router.link", TurnStarted(request_id=RID, prompt_id=RID // 4, instance="i0", turn=0, num_tokens=10))
    logged(log, opened(flow, RID))
    log.add("router.link", turn_done(RID, 0, [*encode("ans 6"), 1]))
    chat(flow, 2, RID, ROW)
    answers = [flow.answers.pop()[1]]
    for turn in range(1, generated_upto + 2):
        logged(log, chat(flow, 10 + turn, RID, history(flow, turn)))
        if turn <= generated_upto:
            from_router(log, flow, turn_done(RID, turn, TURN_TOKENS[turn]))
            answers.append(flow.answers.pop()[1])
    return log, answers


def restarted(log: Log) -> tuple[SessionFlow, Any]:
    flow, env = make()
    effects = flow.restore(rebuild_sessions(log.events, launch=0), 0.0)
    assert not sent(effects, TurnNext) and not sent(effects, SessionEnd)
    assert env.submitted == [(RID, 0, [[*encode("ans 6"), 1]])]  # the agent runs again from the start
    flow.gateway_job(1, "open", "", _open_body(), 0.0)
    assert flow.answers.pop() == (1, {"id": str(RID), "object": "session"})
    return flow, env


def _open_body() -> dict[str, Any]:
    return {"request_id": RID, "messages": ROW, "tools": [], "prompt_token_ids": encode("user=sum 1 2 3 assistant=")}


def answer_of(flow: SessionFlow, job: int) -> Any:
    [(got, answer)] = flow.answers
    flow.answers.clear()
    assert got == job
    return answer


def test_a_restarted_scheduler_replays_logged_turns_waits_for_the_one_generating_then_goes_on() -> None:
    log, first = first_run(generated_upto=1)  # turn 1 generated, turn 2 generating at the crash
    flow, _ = restarted(log)
    assert not chat(flow, 2, RID, ROW)
    assert answer_of(flow, 2).reply == first[0].reply  # turn 0: generated from the row
    assert chat(flow, 3, RID, history(flow, 1)) == []  # turn 1 from the log: nothing sent, nothing logged
    replayed = answer_of(flow, 3)
    assert isinstance(replayed, Answer) and replayed.reply == first[1].reply and replayed.turn == 1
    assert chat(flow, 4, RID, history(flow, 2)) == [] and flow.answers == []  # turn 2 still generates: it waits
    flow.handle(turn_done(RID, 2, TURN_TOKENS[2]), 0.0)  # the router hands it over
    assert answer_of(flow, 4).reply.message["content"] == flow.gateway.text(TURN_TOKENS[2])  # type: ignore[union-attr]
    assert dict(flow.counters).items() >= {"agents_resumed": 1, "turns_replayed": 1, "turns_awaited": 1}.items()
    # the session's record is the first run's tokens: one trajectory, every turn once
    [traj] = flow.gateway.record(str(RID))["trajectories"]  # type: ignore[union-attr]
    assert len(traj["turns"]) == 3
    chat(flow, 5, RID, history(flow, 3))  # past the log: a new turn, here past env.max_turns=3
    assert answer_of(flow, 5).code == "max_turns"


def test_past_the_logged_turns_a_re_run_agent_s_calls_are_new_turns() -> None:
    log, _ = first_run(generated_upto=0)  # turn 1 generating at the crash
    flow, _ = restarted(log)
    chat(flow, 2, RID, ROW)
    flow.answers.clear()
    assert chat(flow, 3, RID, history(flow, 1)) == []
    flow.handle(turn_done(RID, 1, TURN_TOKENS[1]), 0.0)
    assert isinstance(answer_of(flow, 3), Answer)
    effects = chat(flow, 4, RID, history(flow, 2))
    [nxt] = sent(effects, TurnNext)
    [call] = [e.message for e in effects if isinstance(e, Publish) and isinstance(e.message, EnvStepDone)]
    assert nxt.turn == 2 and call.turn == 1 and not flow.sessions[RID].replaying


def test_a_turn_whose_call_was_logged_but_never_sent_is_sent_once_without_logging_it_again() -> None:
    log, _ = first_run(generated_upto=1)
    # the old scheduler died between logging the agent's call (EnvStepDone) and sending its turn
    cut = next(i for i, e in enumerate(log.events) if isinstance(e.message, TurnNext) and e.message.turn == 2)
    log.events = log.events[:cut]
    flow, _ = restarted(log)
    chat(flow, 2, RID, ROW)
    chat(flow, 3, RID, history(flow, 1))
    flow.answers.clear()
    effects = chat(flow, 4, RID, history(flow, 2))
    [nxt] = sent(effects, TurnNext)
    assert nxt.turn == 2 and not [e for e in effects if isinstance(e, Publish)]  # its EnvStepDone is in the log
    assert flow.counters["turns_resent"] == 1


def test_a_re_run_agent_that_asks_for_other_tokens_fails_its_session_naming_session_and_turn() -> None:
    log, _ = first_run(generated_upto=1)
    flow, _ = restarted(log)
    chat(flow, 2, RID, ROW)
    flow.answers.clear()
    effects = chat(flow, 3, RID, [*ROW, {"role": "assistant", "content": "ans 6"}, {"role": "user", "content": "hm"}])
    error = answer_of(flow, 3)
    assert isinstance(error, ApiError) and error.status == 409 and error.code == "history_diverged"
    [end] = sent(effects, SessionEnd)
    assert f"session {RID} turn 1" in end.error and RID not in flow.sessions
    assert not sent(effects, TurnNext)


def test_an_agent_whose_reward_was_logged_but_not_sent_ends_its_session_at_the_restart() -> None:
    log, _ = first_run(generated_upto=1)
    cut = next(i for i, e in enumerate(log.events) if isinstance(e.message, TurnNext) and e.message.turn == 2)
    log.events = log.events[: cut - 1]  # before the agent's call for turn 2 was logged
    log.add("session", step(RID, 1, reward=0.5, acc=1.0, done=True))
    flow, env = make()
    [end] = sent(flow.restore(rebuild_sessions(log.events, launch=0), 0.0), SessionEnd)
    assert end == SessionEnd(request_id=RID, reward=0.5, acc=1.0, num_turns=2) and env.submitted == []


def test_an_agent_re_run_after_its_worker_died_gets_its_turns_back_and_its_dead_call_a_503() -> None:
    flow, env = make()
    opened(flow, RID)
    chat(flow, 2, RID, ROW)
    chat(flow, 3, RID, history(flow, 1))
    flow.handle(turn_done(RID, 1, TURN_TOKENS[1]), 0.0)
    flow.answers.clear()
    assert len(sent(chat(flow, 4, RID, history(flow, 2)), TurnNext)) == 1  # turn 2 generates; the worker dies
    flow.gateway_job(5, "open", "", _open_body(), 0.0)  # the pool runs the agent again on a fresh worker
    (dead_job, retry), (_, opened_again) = flow.answers
    assert dead_job == 4 and isinstance(retry, ApiError) and retry.status == 503 and opened_again["id"] == str(RID)
    flow.answers.clear()
    chat(flow, 6, RID, ROW)
    assert not chat(flow, 7, RID, history(flow, 1))  # from what the session has: nothing sent
    flow.answers.clear()
    assert not chat(flow, 8, RID, history(flow, 2)) and flow.answers == []
    flow.handle(turn_done(RID, 2, TURN_TOKENS[2]), 0.0)
    assert isinstance(answer_of(flow, 8), Answer)
    assert flow.counters["agents_rerun"] == 1 and env.submitted[0][:2] == (RID, 0)


def test_the_resume_rule() -> None:
    log = TurnLog([[], [5, 6], [7]], [True, True, False], [0, 0], [None, None])
    assert place(log, "s", 1, [5, 6], num_generated=2) == "replay"
    assert place(log, "s", 1, [5, 6], num_generated=1) == "wait"
    assert place(log, "s", 2, [7], num_generated=2) == "send"
    assert place(log, "s", 3, [9], num_generated=2) == "new"
    assert place(log, "s", 3, [9], num_generated=4) == "replay"  # generated; its call's tokens never logged
    with pytest.raises(ResumeDivergedError, match=r"session s turn 1: .*first difference at token 1"):
        place(log, "s", 1, [5, 9], num_generated=2)


def test_turn_done_after_the_replay_passed_it_is_kept_for_nobody_waiting() -> None:
    """A turn the router hands over before the re-run agent asks for it answers no call; the call
    that comes later gets it from the log."""
    log, _ = first_run(generated_upto=1)
    flow, _ = restarted(log)
    flow.handle(turn_done(RID, 2, TURN_TOKENS[2]), 0.0)
    assert flow.answers == []
    chat(flow, 2, RID, ROW)
    chat(flow, 3, RID, history(flow, 1))
    flow.answers.clear()
    assert not chat(flow, 4, RID, history(flow, 2))
    assert isinstance(answer_of(flow, 4), Answer) and flow.counters["turns_replayed"] == 2


def test_a_turn_the_router_generated_whose_call_never_reached_the_log_is_replayed_not_asked_again() -> None:
    log, _ = first_run(generated_upto=1)
    # the old scheduler died as it sent turn 2: the router has it, the log has neither its call nor its turn
    cut = next(i for i, e in enumerate(log.events) if isinstance(e.message, TurnNext) and e.message.turn == 2)
    log.events = log.events[: cut - 1]
    flow, _ = restarted(log)
    flow.handle(turn_done(RID, 2, TURN_TOKENS[2]), 0.0)  # the router hands it over on the new link
    chat(flow, 2, RID, ROW)
    chat(flow, 3, RID, history(flow, 1))
    flow.answers.clear()
    effects = chat(flow, 4, RID, history(flow, 2))
    assert not sent(effects, TurnNext) and not [e for e in effects if isinstance(e, Publish)]
    assert answer_of(flow, 4).reply.message["content"] == flow.gateway.text(TURN_TOKENS[2])  # type: ignore[union-attr]
    assert flow.sessions[RID].turn_log.num_turns == 3  # type: ignore[union-attr]


def test_a_turn_whose_message_died_with_the_scheduler_is_sent_again_and_its_call_waits_for_it() -> None:
    """The first scheduler logged turn 2 and was killed before the router got it (no TurnStarted):
    the restored scheduler sends it again, and the re-run agent's call waits for its tokens."""
    log, _ = first_run(generated_upto=1)
    log.events = [e for e in log.events if not (isinstance(e.message, TurnStarted) and e.message.turn == 2)]
    flow, _ = make()
    [again] = sent(flow.restore(rebuild_sessions(log.events, launch=0), 0.0), TurnNext)
    assert (again.request_id, again.turn) == (RID, 2) and flow.counters["restored_turns_resent"] == 1
    flow.gateway_job(1, "open", "", _open_body(), 0.0)
    flow.answers.clear()
    for job, turn in ((2, 0), (3, 1)):
        chat(flow, job, RID, history(flow, turn))
        answer_of(flow, job)
    assert chat(flow, 4, RID, history(flow, 2)) == [] and flow.answers == []  # sent once: it waits
    flow.handle(turn_done(RID, 2, TURN_TOKENS[2]), 0.0)
    assert answer_of(flow, 4).reply.message["content"] == flow.gateway.text(TURN_TOKENS[2])  # type: ignore[union-attr]
