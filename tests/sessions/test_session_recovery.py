"""A restarted session scheduler rebuilds its sessions from the event log and continues each one
by the rule of ``psrl.flows.session_recovery``: wait for the turn, handle the logged answer, or run
the step again from the session's actions."""

from __future__ import annotations

from typing import Any

import numpy as np

from bus.messages import SessionEnd, SessionGone, TrajectoryDone, TurnNext
from bus.schema import Envelope, Event, Message
from psrl.flows.session_recovery import rebuild_sessions
from psrl.launches import INCARNATIONS_PER_LAUNCH
from tests.sessions.test_session_flow import make, sent, started, step, turn_done


class Log:
    """A log in order, one sequence per sender, all of launch ``launch``."""

    def __init__(self, launch: int = 0) -> None:
        self.events: list[Event[Any]] = []
        self.seqs: dict[str, int] = {}
        self.incarnation = launch * INCARNATIONS_PER_LAUNCH

    def add(self, sender: str, message: Message) -> Log:
        seq = self.seqs[sender] = self.seqs.get(sender, 0) + 1
        envelope = Envelope(type(message).KIND, 1, sender, self.incarnation, seq, seq, seq)
        self.events.append(Event(envelope, message))
        return self


def nxt(rid: int, turn: int, obs: list[int]) -> TurnNext:
    return TurnNext(request_id=rid, turn=turn, observation_token_ids=np.asarray(obs, np.int32), max_tokens=5)


def crashed_log() -> Log:
    """Four sessions at the crash: 1 generating its second turn, 2 at its environment with the answer
    logged (never sent on), 3 at its environment with no answer, 4 ended; 5 ended by the router."""
    log = Log()
    for rid in (1, 2, 3, 4, 5):
        log.add("router.link", started(rid)).add("router.link", turn_done(rid, 0, [rid, 7]))
    log.add("session", step(1, 0, [15])).add("session-router.link", nxt(1, 1, [15]))
    log.add("router.link", started(1, turn=1))
    log.add("session", step(2, 0, [16]))  # the scheduler died before sending its next turn
    log.add("session", step(4, 0, done=True, reward=1.0)).add("session-router.link", SessionEnd(4, 1.0, 1.0, 1))
    log.add("router.link", SessionGone(5, "surplus"))
    return log


def test_the_log_gives_back_each_live_session_with_its_actions_and_last_step() -> None:
    recovery = rebuild_sessions(crashed_log().events, launch=0)
    assert sorted(recovery.sessions) == [1, 2, 3]
    one, two, three = (recovery.sessions[r] for r in (1, 2, 3))
    assert one.status == "generate" and one.turn == 0 and [a.tolist() for a in one.actions] == [[1, 7]]
    assert two.status == "env" and two.answer is not None and two.answer.observation_token_ids.tolist() == [16]
    assert three.status == "env" and three.answer is None
    assert (recovery.num_answered, recovery.num_rerun, recovery.num_missing_events) == (1, 1, 0)
    assert len(recovery.seen_event_ids) == 12  # the router's turn reports, turns and session end


def test_an_earlier_launchs_sessions_are_not_this_launchs() -> None:
    assert rebuild_sessions(crashed_log().events, launch=1).sessions == {}


def test_a_restored_scheduler_continues_each_session_by_the_rule_and_finishes_them() -> None:
    flow, env = make()
    out = flow.restore(rebuild_sessions(crashed_log().events, launch=0), 5.0)
    [turn] = sent(out, TurnNext)  # the logged answer goes on at once: exactly its tokens
    assert turn.request_id == 2 and turn.turn == 1 and turn.observation_token_ids.tolist() == [16]
    [end] = sent(out, SessionEnd)  # 4's end is logged, its trajectory not done: it may not have left
    assert end.request_id == 4 and end.reward == 1.0
    assert env.submitted == [(3, 0, [[3, 7]])]  # the unanswered step runs again from its actions
    flow.handle(turn_done(1, 1, [9]), 6.0)  # the generating one's turn arrives as before
    assert env.submitted[-1] == (1, 1, [[1, 7], [9]])
    assert sent(flow.handle(step(3, 0, [5]), 7.0), TurnNext)[0].request_id == 3
    assert dict(flow.counters) == {
        "restored_sessions": 3, "restored_answers": 1, "restored_steps_rerun": 1, "restored_ends_resent": 1
    }  # fmt: skip


def test_a_session_whose_trajectory_ended_is_not_restored() -> None:
    log = crashed_log()
    for rid in (3, 4):
        done = TrajectoryDone(rid, 0, 0, np.zeros(2, np.int32), np.zeros(2, np.float32), np.zeros(2, np.int32), 4, "i0")
        log.add("router.link", done)
    recovery = rebuild_sessions(log.events, launch=0)
    assert 3 not in recovery.sessions and recovery.unconfirmed_ends == {}  # 4's end reached the router


def test_a_turn_handed_over_again_is_taken_once_and_answered_as_before() -> None:
    flow, env = make()
    flow.handle(turn_done(1, 0, [1, 7]), 0.0)
    [first] = sent(flow.handle(step(1, 0, [15]), 0.1), TurnNext)
    again = flow.handle(turn_done(1, 0, [1, 7]), 0.2)  # a restarted router hands the turn over again
    assert sent(again, TurnNext) == [first] and len(env.submitted) == 1  # the same answer; no second step
    flow.handle(turn_done(2, 0, [2]), 0.3)
    assert flow.handle(turn_done(2, 0, [2]), 0.4) == [] and len(env.submitted) == 2  # its step still runs
    [end] = sent(flow.handle(step(2, 0, done=True, reward=1.0), 0.5), SessionEnd)
    assert sent(flow.handle(turn_done(2, 0, [2]), 0.6), SessionEnd) == [end]  # ended: the end again
    assert len(env.submitted) == 2 and flow.counters["repeated_turns"] == 3


def test_a_restored_scheduler_answers_a_repeated_turn_with_the_logged_next_turn() -> None:
    flow, env = make()
    flow.restore(rebuild_sessions(crashed_log().events, launch=0), 5.0)
    assert sent(flow.handle(turn_done(1, 0, [1, 7]), 6.0), TurnNext)[0].observation_token_ids.tolist() == [15]
    assert sent(flow.handle(turn_done(4, 0, [4, 7]), 6.1), SessionEnd)[0].reward == 1.0  # ended before the crash
    assert all(rid != 4 for rid, _, _ in env.submitted)


def test_a_next_turn_the_router_never_placed_is_sent_again_on_restore() -> None:
    """The scheduler logged its next turn and was killed before the message left it: nothing would
    ever generate the turn, so the restored scheduler sends it again (the router takes a turn once)."""
    log = Log()
    log.add("router.link", started(1)).add("router.link", turn_done(1, 0, [1, 7]))
    log.add("session", step(1, 0, [15])).add("session-router.link", nxt(1, 1, [15]))
    restored = rebuild_sessions(log.events, launch=0)
    assert restored.sessions[1].next_placed is False
    flow, env = make()
    [again] = sent(flow.restore(restored, 5.0), TurnNext)
    assert (again.request_id, again.turn, again.observation_token_ids.tolist()) == (1, 1, [15])
    assert flow.counters["restored_turns_resent"] == 1 and env.submitted == []
    flow.handle(turn_done(1, 1, [9]), 6.0)  # generated once it arrives: the session goes on as before
    assert env.submitted == [(1, 1, [[1, 7], [9]])]
    placed = rebuild_sessions(log.add("router.link", started(1, turn=1)).events, launch=0)
    assert sent(make()[0].restore(placed, 5.0), TurnNext) == []  # placed: its tokens are coming
