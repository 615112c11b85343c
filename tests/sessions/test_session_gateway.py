"""Agent sessions in the session scheduler's flow: the gateway's calls become the router's turns.

The first turn (generated from the row) starts the agent and answers its first call; each new call
becomes a next turn whose observation is exactly the new messages' tokens (logged as the agent's
answer); a hung session holds the call's turn until it is continued; the agent's reward ends the
session; a session the router ends answers its pending call with a 409."""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bus.messages import EnvStepDone, SessionEnd, SessionGone, TurnNext
from psrl.config import load_config
from psrl.flows.effects import Effect, Publish
from psrl.flows.session import SessionFlow
from psrl.gateway.api import ApiError, parse_chat
from psrl.gateway.sessions import Answer
from psrl.gateway.setup import build_gateway
from tests.sessions.test_session_flow import RecordingEnv, sent, status, step, turn_done

DEMO = "psrl/assets/demo_model"
ROW = [{"role": "user", "content": "sum 1 2 3"}]
TA = "psrl.rollout_coordination.session_strategy.thunder_agent."
OVERRIDES = [
    "env.enable=true",
    "env.max_turns=3",
    "env.max_turn_tokens=6",
    "agent.entry=x.y:run",
    "agent.dataset=unused.jsonl",
    TA + "enable=true",
    TA + "buffer_per_session=10",
]
TOKENIZER = Tokenizer.from_file(f"{DEMO}/tokenizer.json")


def encode(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False).ids


def make() -> tuple[SessionFlow, RecordingEnv]:
    config = load_config("demo", OVERRIDES)
    env = RecordingEnv()
    return SessionFlow(config, env, gateway=build_gateway(config)), env


def opened(flow: SessionFlow, rid: int = 8, first: str = "ans 6") -> list[Effect]:
    effects = flow.handle(turn_done(rid, 0, [*encode(first), 1]), 0.0)
    prompt = encode("user=sum 1 2 3 assistant=")
    flow.gateway_job(1, "open", "", {"request_id": rid, "messages": ROW, "tools": [], "prompt_token_ids": prompt}, 0.0)
    assert flow.answers.pop() == (1, {"id": str(rid), "object": "session"})
    return effects


def chat(flow: SessionFlow, job: int, rid: int, messages: list[dict[str, Any]]) -> list[Effect]:
    flow.gateway_job(job, "chat", str(rid), parse_chat({"messages": messages}), 0.0)
    return flow.take()


def test_calls_become_turns_and_the_agent_s_reward_ends_the_session() -> None:
    flow, env = make()
    opened(flow)
    assert env.submitted[0][:2] == (8, 0)  # the agent's run starts with the first turn
    chat(flow, 2, 8, ROW)
    [(job, first)] = flow.answers
    assert job == 2 and isinstance(first, Answer) and first.reply.message["content"] == "ans 6"
    flow.answers.clear()
    history = [*ROW, {"role": "assistant", "content": "ans 6"}, {"role": "user", "content": "why"}]
    effects = chat(flow, 3, 8, history)
    [nxt] = sent(effects, TurnNext)
    assert nxt.turn == 1 and nxt.observation_token_ids.tolist() == encode(" user=why assistant=")
    [logged] = [e.message for e in effects if isinstance(e, Publish) and isinstance(e.message, EnvStepDone)]
    assert logged.turn == 0 and np.array_equal(logged.observation_token_ids, nxt.observation_token_ids)
    assert flow.answers == []  # the call waits for its turn
    flow.handle(turn_done(8, 1, [*encode("because"), 1]), 0.0)
    [(job, second)] = flow.answers
    assert job == 3 and second.reply.message["content"] == "because" and second.turn == 1
    ends = sent(flow.handle(step(8, 0, reward=0.75, acc=1.0, done=True), 0.0), SessionEnd)
    assert ends == [SessionEnd(request_id=8, reward=0.75, acc=1.0, num_turns=2)]


def test_an_edited_history_a_busy_session_and_the_turn_limit_get_errors() -> None:
    flow, _ = make()
    opened(flow)
    # a conversation sharing no token with the session ("system=..." against "user=..."): no branch point
    chat(flow, 2, 8, [{"role": "system", "content": "be short"}, *ROW])
    assert isinstance(flow.answers[-1][1], ApiError) and flow.answers[-1][1].code == "history_edited"
    history = [*ROW, {"role": "assistant", "content": "ans 6"}, {"role": "user", "content": "more"}]
    chat(flow, 3, 8, history)
    chat(flow, 4, 8, history)
    assert flow.answers[-1][1].status == 429  # one call at a time
    flow.handle(turn_done(8, 1, [5, 1]), 0.0)
    flow.answers.clear()
    later = [*history, {"role": "assistant", "content": flow.gateway.text([5])}, {"role": "user", "content": "go"}]
    chat(flow, 5, 8, later)
    flow.handle(turn_done(8, 2, [6, 1]), 0.0)
    flow.answers.clear()
    chat(
        flow, 6, 8, [*later, {"role": "assistant", "content": flow.gateway.text([6])}, {"role": "user", "content": "x"}]
    )
    assert flow.answers[-1][1].status == 409 and flow.answers[-1][1].code == "max_turns"


def test_a_hung_session_holds_the_call_and_an_ended_one_cancels_it() -> None:
    flow, _ = make()
    opened(flow)
    flow.sessions[8].hang_state = "hung"  # as a ThunderAgent tick would
    history = [*ROW, {"role": "assistant", "content": "ans 6"}, {"role": "user", "content": "more"}]
    assert sent(chat(flow, 3, 8, history), TurnNext) == [] and flow.sessions[8].held is not None
    flow.handle(SessionGone(request_id=8, reason="surplus"), 0.0)
    [(job, error)] = flow.answers
    assert job == 3 and error.status == 409 and "surplus" in error.message
    assert "8" not in flow.gateway.sessions


def test_hang_continue_schedules_a_session_once_its_agent_runs() -> None:
    flow, _ = make()
    flow.handle(status("i0", 20, 90), 0.0)  # too small for one session: a scheduled one is hung
    flow.handle(turn_done(4, 0, [5, 1]), 0.0)  # its agent waits for a worker
    flow.tick(0.0)
    assert flow.sessions[4].hang_state == "running"
    opened(flow)
    flow.tick(0.0)
    assert flow.sessions[8].hang_state == "hung" and flow.sessions[4].hang_state == "running"
