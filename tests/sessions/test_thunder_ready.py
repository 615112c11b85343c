"""ThunderAgent's room goes to turns that are ready before sessions still at their environment
(``ready_first``), and ``max_ready_wait_s`` bounds a ready turn's wait by hanging sessions at their
environment on its instance."""

from __future__ import annotations

import pytest

from bus.messages import TurnNext
from psrl.config import load_config
from psrl.config.coordination import ThunderAgent
from psrl.coordination.session import InstanceCapacity, SessionInfo, schedule_sessions
from psrl.errors import ConfigError
from tests.sessions.test_session_flow import make, sent, started, status, step, turn_done

TA = "psrl.rollout_coordination.session_strategy.thunder_agent."


def settings(*overrides: str) -> ThunderAgent:
    config = load_config("agentic", [TA + "buffer_per_session=0", *overrides])
    return config.psrl.rollout_coordination.session_strategy.thunder_agent


def hung(session_id: str, tokens: int, waiting_s: float = 0.0) -> SessionInfo:
    return SessionInfo(session_id, "i0", "env", "hung", tokens, hung_for_s=5.0, waiting_s=waiting_s)


def running(session_id: str, tokens: int, status: str = "env") -> SessionInfo:
    return SessionInfo(session_id, "i0", status, "running", tokens)  # type: ignore[arg-type]


def decide(total: int, sessions: list[SessionInfo], *overrides: str) -> tuple[list[str], list[str]]:
    instance = InstanceCapacity("i0", total_tokens=total, used_tokens=float(total))  # no sharing credit
    decision = schedule_sessions([instance], sessions, settings(*overrides))
    return list(decision.hang), [order.session_id for order in decision.resume]


def test_a_ready_turn_gets_the_room_before_a_smaller_session_still_at_its_environment() -> None:
    sessions = [hung("at_tool", 100), hung("ready", 300, waiting_s=0.4), hung("ready_longer", 350, waiting_s=0.9)]
    assert decide(400, sessions) == ([], ["ready_longer"])  # longest waiting first; the rest does not fit
    assert decide(500, sessions) == ([], ["ready_longer", "at_tool"])  # a smaller one passes what does not fit
    assert decide(400, sessions, TA + "ready_first=false") == ([], ["at_tool", "ready"])  # smallest first


def test_a_ready_turn_that_waited_long_enough_sheds_sessions_at_their_environment() -> None:
    sessions = [
        running("tool_a", 100), running("tool_b", 150), running("tool_c", 400), running("gen", 200, "generate"),
        hung("ready", 200, waiting_s=1.5),
    ]  # fmt: skip
    # 850 tokens running in 1,000: room 150, the ready turn needs 200; shedding tool_a (100) frees enough
    assert decide(1000, sessions) == ([], [])  # off by default: it waits for room
    assert decide(1000, sessions, TA + "max_ready_wait_s=1") == (["tool_a"], ["ready"])
    assert decide(1000, sessions, TA + "max_ready_wait_s=2") == ([], [])  # not waited long enough yet


def test_no_session_is_shed_when_those_at_their_environment_cannot_make_the_room() -> None:
    sessions = [running("tool_a", 100), running("gen", 800, "generate"), hung("ready", 400, waiting_s=3.0)]
    assert decide(1000, sessions, TA + "max_ready_wait_s=1") == ([], [])  # generating sessions are never shed


def test_a_bound_on_ready_waits_needs_ready_first() -> None:
    with pytest.raises(ConfigError, match="max_ready_wait_s"):
        load_config("agentic", [TA + "ready_first=false", TA + "max_ready_wait_s=1"])


def test_thunder_settings_with_the_scheduler_off_are_refused_not_ignored() -> None:
    with pytest.raises(ConfigError, match=r"max_ready_wait_s.*scheduler off"):
        load_config("agentic", [TA + "enable=false", TA + "max_ready_wait_s=1"])
    load_config("agentic", [TA + "enable=false"])  # the preset's own scope and tick: nothing changed by hand


def test_the_scheduler_knows_how_long_a_held_turn_has_waited_and_counts_the_wait() -> None:
    flow, _ = make()
    flow.handle(status("i0", 100, 0), 0.0)
    for rid in (1, 2):
        flow.handle(started(rid, tokens=30), 0.0)
        flow.handle(turn_done(rid, 0, [7, 1], total=60), 0.0)
    flow.tick(1.0)  # 2 x (60 + 10) > 100: session 1 is hung at its environment
    assert flow.sessions[1].hang_state == "hung" and flow.sessions[1].info(1.5).waiting_s == 0.0
    assert sent(flow.handle(step(1, 0, [15]), 2.0), TurnNext) == []  # its turn is ready, and held
    assert flow.sessions[1].info(2.5).waiting_s == 0.5
    flow.handle(status("i0", 1000, 0), 3.0)
    assert [t.request_id for t in sent(flow.tick(3.0), TurnNext)] == [1]
    assert list(flow.held_waits) == [1.0]  # one held turn, which waited 1 s
    assert flow.sessions[1].info(4.0).waiting_s == 0.0
