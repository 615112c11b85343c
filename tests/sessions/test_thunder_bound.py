"""ThunderAgent's bound on a hung session's wait (``max_hang_s``): overdue sessions are continued first,
oldest first, and nothing smaller passes one that does not fit yet."""

from __future__ import annotations

from psrl.config import load_config
from psrl.config.coordination import ThunderAgent
from psrl.coordination.session import (
    ContinueOrder,
    InstanceCapacity,
    SessionDecision,
    SessionInfo,
    schedule_sessions,
)
from tests.sessions.test_session_flow import make, started, turn_done

TA = "psrl.rollout_coordination.session_strategy.thunder_agent."


def settings(max_hang_s: float) -> ThunderAgent:
    config = load_config("agentic", [TA + f"max_hang_s={max_hang_s}", TA + "buffer_per_session=0"])
    return config.psrl.rollout_coordination.session_strategy.thunder_agent


def hung(session_id: str, tokens: int, hung_for_s: float) -> SessionInfo:
    return SessionInfo(session_id, "i0", "env", "hung", tokens, hung_for_s=hung_for_s)


def continued(room: int, max_hang_s: float) -> list[str]:
    instance = InstanceCapacity("i0", total_tokens=room, used_tokens=0.0)
    sessions = [hung("big", 900, 10.0), hung("small", 200, 1.0), hung("tiny", 100, 0.5)]
    return [order.session_id for order in schedule_sessions([instance], sessions, settings(max_hang_s)).resume]


def test_smallest_first_alone_lets_the_large_session_wait_while_smaller_ones_fit() -> None:
    assert continued(room=400, max_hang_s=0) == ["tiny", "small"]


def test_an_overdue_session_keeps_the_room_that_frees_until_it_fits() -> None:
    assert continued(room=400, max_hang_s=5) == []  # nothing passes the overdue one
    assert continued(room=1000, max_hang_s=5) == ["big", "tiny"]  # then the rest, smallest first
    assert continued(room=400, max_hang_s=20) == ["tiny", "small"]  # not overdue yet: smallest first


def test_the_scheduler_reports_how_long_each_session_has_been_hung() -> None:
    flow, _ = make(TA + "max_hang_s=5")
    flow.handle(started(0), 0.0)
    flow.handle(turn_done(0, 0, [5, 6]), 0.5)
    session = flow.sessions[0]
    flow._apply(_hang("0"), 1.0)
    assert session.hang_state == "hung" and session.info(4.0).hung_for_s == 3.0
    flow._apply(_resume("0"), 4.0)
    assert session.hang_state == "running" and session.info(6.0).hung_for_s == 0.0


def _hang(session_id: str) -> SessionDecision:
    return SessionDecision(hang=(session_id,), resume=(), remaining={})


def _resume(session_id: str) -> SessionDecision:
    return SessionDecision(hang=(), resume=(ContinueOrder(session_id, "i0", False),), remaining={})
