"""ThunderAgent hang / continue scheduling of multi-turn sessions."""

from __future__ import annotations

from typing import Any

from psrl.config.coordination import ThunderAgent
from psrl.coordination.session import InstanceCapacity, SessionInfo, schedule_sessions


def session(sid: str, instance: str | None, status: str, tokens: int, hang: str = "running", **kw: Any) -> SessionInfo:
    return SessionInfo(sid, instance, status, hang, tokens, **kw)  # type: ignore[arg-type]


def cap(instance: str, total: int, used: float) -> InstanceCapacity:
    return InstanceCapacity(instance, total, used)


def agent(**fields: Any) -> ThunderAgent:
    values: dict[str, Any] = {"enable": True, "buffer_per_session": 10}
    values.update(fields)
    return ThunderAgent(**values)


class TestHang:
    def test_env_sessions_go_first_then_generate_smallest_first(self) -> None:
        sessions = [
            session("g-big", "i0", "generate", 400),
            session("g-small", "i0", "generate", 100),
            session("e-big", "i0", "env", 300),
            session("e-small", "i0", "env", 200),
        ]
        # demand = 400 + 100 + 300 + 200 + 4 x 10 = 1040; shared = max(0, 500 - 500) = 0
        decision = schedule_sessions([cap("i0", 600, 500)], sessions, agent())
        assert decision.hang == ("e-small", "e-big")  # 1040 - 210 - 310 = 520 <= 600
        assert decision.remaining["i0"] == 80

    def test_generating_sessions_hang_when_env_ones_are_not_enough(self) -> None:
        sessions = [
            session("e", "i0", "env", 50),
            session("g1", "i0", "generate", 300),
            session("g2", "i0", "generate", 200),
        ]
        decision = schedule_sessions([cap("i0", 400, 500)], sessions, agent())
        assert decision.hang == ("e", "g2")

    def test_prefix_sharing_credit_and_env_weight(self) -> None:
        sessions = [
            session("g1", "i0", "generate", 300),
            session("g2", "i0", "generate", 300),
            session("e", "i0", "env", 200),
        ]
        # 600 generate tokens use only 400 measured: 200 are shared prefixes
        shared = schedule_sessions([cap("i0", 700, 400)], sessions, agent())
        assert shared.hang == () and shared.remaining["i0"] == 700 + 200 - 800 - 30
        pair = [session("g", "i0", "generate", 300), session("e", "i0", "env", 200)]
        full_weight = schedule_sessions([cap("i0", 450, 300)], pair, agent())
        assert full_weight.hang == ("e",)  # 300 + 200 + 20 = 520 > 450
        half_weight = schedule_sessions([cap("i0", 450, 300)], pair, agent(env_token_weight=0.5))
        assert half_weight.hang == () and half_weight.remaining["i0"] == 30  # 300 + 100 + 20 = 420

    def test_unpinned_closing_and_other_instances_sessions_are_left_alone(self) -> None:
        sessions = [
            session("free", None, "env", 10_000),
            session("closing", "i0", "env", 10_000, is_closing=True),
            session("elsewhere", "i1", "generate", 50),
        ]
        decision = schedule_sessions([cap("i0", 100, 0), cap("i1", 1000, 50)], sessions, agent())
        assert decision.hang == ()


class TestContinue:
    def test_bucketed_readmits_on_the_same_instance_smallest_first_while_it_fits(self) -> None:
        sessions = [
            session("run", "i0", "generate", 100),
            session("h1", "i0", "env", 150, hang="hung"),
            session("h2", "i0", "env", 50, hang="hung"),
            session("h3", "i0", "env", 400, hang="hung"),
            session("other", "i1", "env", 10, hang="hung"),
        ]
        decision = schedule_sessions([cap("i0", 400, 100), cap("i1", 5, 0)], sessions, agent())
        # remaining = 400 - 110 = 290: h2 (60) fits, h1 (160) fits, h3 does not; i1 has no room
        assert [(o.session_id, o.instance_id) for o in decision.resume] == [("h2", "i0"), ("h1", "i0")]
        assert decision.remaining["i0"] == 70 and not decision.resume[0].force_pin

    def test_global_places_largest_first_on_the_roomiest_instance(self) -> None:
        sessions = [
            session("a", "i0", "env", 90, hang="hung"),
            session("b", "i0", "env", 40, hang="hung"),
            session("c", "i1", "env", 300, hang="hung"),
        ]
        capacities = [cap("i0", 120, 0), cap("i1", 200, 0), cap("i2", 30, 0)]
        decision = schedule_sessions(capacities, sessions, agent(continue_scope="global", continue_force_pin=True))
        # total room of instances above the buffer: 120 + 200 + 30 = 350; smallest first: b (50),
        # a (100) fit, c (310) does not. Largest first: a -> i1 (200), b -> i0 (120).
        assert [(o.session_id, o.instance_id) for o in decision.resume] == [("a", "i1"), ("b", "i0")]
        assert all(o.force_pin for o in decision.resume)

    def test_nothing_continues_the_tick_it_was_hung(self) -> None:
        sessions = [session("e", "i0", "env", 500), session("g", "i0", "generate", 100)]
        decision = schedule_sessions([cap("i0", 300, 100)], sessions, agent())
        assert decision.hang == ("e",) and decision.resume == ()


class TestNoHeadOfLineBlocking:
    def test_a_large_hung_session_never_stops_a_smaller_one_that_fits(self) -> None:
        sessions = [
            session("huge", "i0", "env", 900, hang="hung"),
            session("small", "i0", "env", 40, hang="hung"),
            session("medium", "i0", "env", 120, hang="hung"),
        ]
        for scope in ("bucketed", "global"):
            decision = schedule_sessions([cap("i0", 200, 0)], sessions, agent(continue_scope=scope))
            # 200 of room: small (50) and medium (130) fit, huge (910) never does
            assert sorted(o.session_id for o in decision.resume) == ["medium", "small"], scope

    def test_global_skips_a_session_that_fits_no_single_instance(self) -> None:
        sessions = [session("wide", "i0", "env", 140, hang="hung"), session("narrow", "i1", "env", 60, hang="hung")]
        # the total room (100 + 100) holds both, but no instance holds "wide": it waits, "narrow" goes
        decision = schedule_sessions([cap("i0", 100, 0), cap("i1", 100, 0)], sessions, agent(continue_scope="global"))
        assert [o.session_id for o in decision.resume] == ["narrow"]
