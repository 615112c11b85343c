"""The session scheduler's flow: the turn loop, session ends and failures, hang and continue."""

from __future__ import annotations

import numpy as np

from bus.messages import (
    EnvStepDone,
    InstanceStatus,
    SessionEnd,
    SessionGone,
    SessionTick,
    TurnDone,
    TurnNext,
    TurnStarted,
)
from psrl.config import load_config
from psrl.coordination.session import decode_session_tick, schedule_sessions
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.session import SessionFlow

TA = "psrl.rollout_coordination.session_strategy.thunder_agent."
BASE = [
    "env.enable=true",
    "task.name=digit_chain",
    "env.max_turns=3",
    "env.max_turn_tokens=5",
    TA + "enable=true",
    TA + "buffer_per_session=10",
]


class RecordingEnv:
    """The environment port at the edge of the test: it records what the flow asks for."""

    def __init__(self) -> None:
        self.submitted: list[tuple[int, int, list[list[int]]]] = []
        self.cancelled: list[int] = []

    def submit(self, request_id: int, prompt_id: int, turn: int, actions: list[np.ndarray]) -> None:
        self.submitted.append((request_id, turn, [a.tolist() for a in actions]))

    def cancel(self, request_id: int) -> None:
        self.cancelled.append(request_id)


def make(*overrides: str) -> tuple[SessionFlow, RecordingEnv]:
    env = RecordingEnv()
    return SessionFlow(load_config("demo", [*BASE, *overrides]), env), env


def sent(effects: list[Effect], kind: type) -> list:
    return [e.message for e in effects if isinstance(e, Send) and isinstance(e.message, kind)]


def started(rid: int, instance: str = "i0", turn: int = 0, tokens: int = 10) -> TurnStarted:
    return TurnStarted(request_id=rid, prompt_id=rid // 4, instance=instance, turn=turn, num_tokens=tokens)


def turn_done(rid: int, turn: int, tokens: list[int], instance: str = "i0", total: int = 20) -> TurnDone:
    return TurnDone(
        request_id=rid,
        prompt_id=rid // 4,
        instance=instance,
        turn=turn,
        token_ids=np.asarray(tokens, np.int32),
        num_tokens=total,
        finish_reason=0,
    )


def step(rid: int, turn: int, obs: list[int] = (), **kw: object) -> EnvStepDone:
    return EnvStepDone(request_id=rid, turn=turn, observation_token_ids=np.asarray(obs, np.int32), **kw)  # type: ignore[arg-type]


def status(instance: str, capacity: int, used_blocks: int, total_blocks: int = 100) -> InstanceStatus:
    return InstanceStatus(
        instance=instance,
        weight_version=0,
        num_running=0,
        num_waiting=0,
        kv_blocks_used=used_blocks,
        kv_blocks_total=total_blocks,
        kv_capacity_tokens=capacity,
    )


def test_turns_alternate_with_environment_steps_until_the_environment_is_done() -> None:
    flow, env = make()
    flow.handle(started(5), 0.0)
    assert flow.handle(turn_done(5, 0, [7, 1]), 0.1) == []
    assert env.submitted == [(5, 0, [[7, 1]])]
    nxt = sent(flow.handle(step(5, 0, [15, 18], reward=0.5), 0.2), TurnNext)
    assert len(nxt) == 1 and nxt[0].turn == 1 and nxt[0].observation_token_ids.tolist() == [15, 18]
    assert nxt[0].max_tokens == 5 and nxt[0].force_pin_instance == ""
    flow.handle(started(5, turn=1), 0.3)
    flow.handle(turn_done(5, 1, [9, 1]), 0.4)
    assert env.submitted[-1] == (5, 1, [[7, 1], [9, 1]])  # every action so far: a fresh worker can replay
    end = sent(flow.handle(step(5, 1, reward=0.75, acc=1.0, done=True), 0.5), SessionEnd)
    assert end == [SessionEnd(request_id=5, reward=0.75, acc=1.0, num_turns=2)]
    assert flow.sessions == {}


def test_the_last_turn_ends_the_session_with_the_reward_so_far() -> None:
    flow, _ = make("env.max_turns=1")
    flow.handle(turn_done(3, 0, [7, 1]), 0.0)
    assert sent(flow.handle(step(3, 0, [15], reward=0.25), 0.1), SessionEnd)[0].reward == 0.25


def test_a_failed_step_fails_its_session_with_the_reason_and_late_answers_are_dropped() -> None:
    flow, env = make()
    flow.handle(turn_done(1, 0, [7]), 0.0)
    flow.handle(turn_done(2, 0, [8]), 0.0)
    end = sent(flow.handle(step(1, 0, error="TimeoutError: environment step timed out after 10 s"), 0.1), SessionEnd)
    assert end[0].error.startswith("TimeoutError") and 1 not in flow.sessions
    assert flow.handle(step(1, 0, [3]), 0.2) == [] and flow.counters["late_env_steps"] == 1
    assert 2 in flow.sessions  # the other session is untouched
    flow.handle(SessionGone(request_id=2, reason="surplus"), 0.3)
    assert flow.sessions == {} and env.cancelled == [2]


def test_an_unknown_later_turn_fails_its_session_instead_of_hanging_forever() -> None:
    flow, _ = make()
    end = sent(flow.handle(turn_done(9, 2, [7]), 0.0), SessionEnd)
    assert end and "history" in end[0].error


def test_hung_sessions_hold_their_next_turn_until_continued() -> None:
    flow, _ = make(TA + "continue_force_pin=true")
    flow.handle(status("i0", 100, 0), 0.0)
    for rid in (1, 2):
        flow.handle(started(rid, tokens=30), 0.0)
        flow.handle(turn_done(rid, 0, [7, 1], total=60), 0.0)  # both at their environment, 60 tokens each
    effects = flow.tick(1.0)  # demand 2 x (60 + 10) = 140 > 100: the smaller (by id on a tie) is hung
    tick = next(e.message for e in effects if isinstance(e, Publish) and isinstance(e.message, SessionTick))
    assert tick.hung == [1] and flow.sessions[1].hang_state == "hung"
    assert sent(flow.handle(step(1, 0, [15]), 1.1), TurnNext) == []  # held, not sent
    assert len(sent(flow.handle(step(2, 0, [15]), 1.1), TurnNext)) == 1  # the running one goes on
    flow.handle(status("i0", 1000, 0), 2.0)  # room again
    released = sent(flow.tick(2.0), TurnNext)
    assert [(t.request_id, t.force_pin_instance) for t in released] == [(1, "i0")]
    log = decode_session_tick(tick.record)
    assert schedule_sessions(log.instances, log.sessions, flow.thunder) == log.decision  # replayable


def test_a_generating_session_is_hung_at_its_turn_boundary_never_aborted() -> None:
    flow, env = make()
    flow.handle(status("i0", 50, 100), 0.0)  # full: 50 tokens in use
    flow.handle(started(4, tokens=80), 0.0)  # generating: 80 + 10 > 50 + 30 shared
    effects = flow.tick(1.0)
    assert flow.sessions[4].marked_for_hang and flow.sessions[4].hang_state == "running"
    assert not [e for e in effects if isinstance(e, Send)]  # nothing goes to the router or an instance
    flow.handle(turn_done(4, 0, [7, 1], total=82), 1.5)
    assert flow.sessions[4].hang_state == "hung" and env.submitted  # the environment step still runs
    assert sent(flow.handle(step(4, 0, [15]), 1.6), TurnNext) == []
