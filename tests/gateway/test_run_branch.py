"""A run's session branching on an edited history, part by part: the scheduler's gateway sends the
cut (``TurnNext.cut_to``; ``prompt_keep`` for a branch inside the row's prompt), the router cuts its
trajectory (tokens, log-probs, versions, loss mask alike; the prompt too; V_traj kept), the trainer's
data carries the cut prompt, the sessions checker and both recoveries apply the cut, and the resume
rule checks it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bus.messages import (
    EnvStepDone,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SessionEnd,
    SessionGone,
    TrajectoryDone,
    TurnDone,
    TurnNext,
    TurnStarted,
)
from bus.schema import Envelope, Event
from psrl.config import load_config
from psrl.flows.router import RouterFlow
from psrl.flows.router_recovery import SessionPrefix, rebuild_router
from psrl.flows.session import SessionFlow
from psrl.flows.session_recovery import rebuild_sessions
from psrl.gateway.api import ApiError
from psrl.gateway.resume import ResumeDivergedError, TurnLog, place
from psrl.gateway.sessions import Answer
from psrl.gateway.setup import build_gateway
from psrl.reliability.session_invariants import SessionFacts, check_sessions
from psrl.staleness.types import LedgerSizes
from tests.flows.flow_helpers import destinations, request, result, sent, status
from tests.flows.test_router_recovery import Log as RecoveryLog
from tests.sessions.test_gateway_resume import from_router, logged
from tests.sessions.test_router_sessions import _first_turn, _router, flow_config
from tests.sessions.test_session_flow import RecordingEnv
from tests.sessions.test_session_gateway import OVERRIDES, ROW, chat, encode, make, opened, turn_done
from tests.sessions.test_session_recovery import Log


def _turn(flow, where: str, turn: TurnNext, num_tokens: int, version: int = 0):
    flow.handle(turn, 2.0)
    effects = flow.route(2.0)
    [req] = sent(effects, GenerateRequest)
    assert destinations(effects, GenerateRequest) == [where]
    return req, flow.handle(result(req, where, num_tokens=num_tokens, version=version), 3.0)


def test_the_router_cuts_the_trajectory_back_and_keeps_its_pin() -> None:
    flow = _router()
    req, where, _ = _first_turn(flow)  # turn 0: 10 11 12
    obs = np.asarray([15, 18, 4], np.int32)
    _turn(flow, where, TurnNext(request_id=0, turn=1, observation_token_ids=obs, max_tokens=5), 2, 1)
    traj = flow.tracker.live[0]
    assert traj.token_ids.tolist() == [10, 11, 12, 15, 18, 4, 10, 11] and traj.v_traj == 0
    # the agent dropped turn 1's reply: keep turn 0 and the observation's first token, then its new tokens
    cut = TurnNext(request_id=0, turn=2, observation_token_ids=np.asarray([7, 7], np.int32), max_tokens=5,
                   cut_to=4, num_cut=4)  # fmt: skip
    req2, out = _turn(flow, where, cut, 3, 2)
    assert req2.prompt_token_ids.tolist() == [*req.prompt_token_ids.tolist(), 10, 11, 12, 15, 7, 7]
    assert req2.pinned_version == 0 and flow.counters["session_cuts"] == 1 and flow.counters["session_tokens_cut"] == 4
    [done] = sent(out, TurnDone)
    assert done.turn == 2 and done.token_ids.tolist() == [10, 11, 12]
    [end] = sent(flow.handle(SessionEnd(request_id=0, reward=1.0, acc=1.0, num_turns=3), 4.0), TrajectoryDone)
    assert end.token_ids.tolist() == [10, 11, 12, 15, 7, 7, 10, 11, 12] and end.v_traj == 0
    assert end.loss_mask.tolist() == [1, 1, 1, 0, 0, 0, 1, 1, 1]
    assert end.logprobs.tolist() == [-0.5] * 3 + [0.0] * 3 + [-0.5] * 3
    assert end.versions.tolist() == [0, 0, 0, 0, 0, 0, 2, 2, 2]  # observations: the kept last token's version


def test_a_cut_past_the_response_fails_the_session_naming_it() -> None:
    flow = _router()
    _first_turn(flow)
    bad = TurnNext(request_id=0, turn=1, observation_token_ids=np.asarray([1], np.int32), max_tokens=5, cut_to=9)
    out = flow.handle(bad, 2.0)
    [gone] = sent(out, SessionGone)
    assert "turn 1: cut_to is 9; the response has 3 tokens" in gone.reason
    assert flow.counters["bad_cuts"] == 1 and 0 not in flow.tracker.live
    [ended] = sent(out, TrajectoryDone)
    assert ended.finish_reason == FinishReason.ERROR


def test_the_scheduler_sends_a_dropped_reply_as_a_cut_and_refuses_a_call_sharing_no_token() -> None:
    flow, _ = make()
    opened(flow, first="ans 6")
    chat(flow, 2, 8, ROW)  # the first call: the seeded turn
    history = [*ROW, {"role": "assistant", "content": "ans 6"}, {"role": "user", "content": "why"}]
    [nxt] = sent(chat(flow, 3, 8, history), TurnNext)
    assert nxt.cut_to == -1 and nxt.num_cut == 0
    flow.handle(turn_done(8, 1, [*encode("because"), 1]), 0.0)
    flow.answers.clear()
    # the agent drops its last reply and says something else after "why": a cut back into turn 1's observation
    edited = [*history, {"role": "user", "content": "ans only"}]
    [cut] = sent(chat(flow, 4, 8, edited), TurnNext)
    turn0, obs1, turn1 = [*encode("ans 6"), 1], encode(" user=why assistant="), [*encode("because"), 1]
    delta = encode(" user=why user=ans only assistant=")  # the call's new tokens after turn 0
    shared = next(i for i, (x, y) in enumerate(zip(obs1, delta, strict=False)) if x != y)
    assert cut.turn == 2 and cut.cut_to == len(turn0) + shared and shared > 0
    assert cut.num_cut == len(obs1) - shared + len(turn1)
    assert cut.observation_token_ids.tolist() == delta[shared:]
    assert flow.counters["branches"] == 1
    flow.handle(turn_done(8, 2, [*encode("ans 7"), 1]), 0.0)
    [(job, answer)] = flow.answers
    assert job == 4 and answer.reply.message["content"] == "ans 7"
    record = flow.gateway.record("8")
    assert record["current"] == 1 and len(record["trajectories"]) == 2
    branch = record["trajectories"][1]
    prompt = encode("user=sum 1 2 3 assistant=")
    router_response = [*turn0, *obs1[:shared], *cut.observation_token_ids.tolist(), *encode("ans 7"), 1]
    assert branch["token_ids"] == prompt + router_response  # what the router's cut trajectory holds
    flow.answers.clear()
    # this template renders a system message first ("system=..."): no token in common with "user=...", no branch
    changed = [{"role": "system", "content": "be short"}, *ROW]
    assert sent(chat(flow, 5, 8, changed), TurnNext) == []
    [(_, refused)] = flow.answers
    assert isinstance(refused, ApiError) and refused.status == 409 and refused.code == "history_edited"
    assert "session 8 turn 0: the conversation shares no token" in refused.message


def test_the_sessions_checker_applies_cuts() -> None:
    facts = SessionFacts()
    facts.observe(TurnDone(request_id=1, prompt_id=0, instance="i", turn=0, token_ids=np.asarray([5, 6]),
                           num_tokens=4, finish_reason=0))  # fmt: skip
    facts.observe(_step(1, 0, [7, 8]))
    facts.observe(TurnNext(request_id=1, turn=1, observation_token_ids=np.asarray([7, 8]), max_tokens=4))
    facts.observe(TurnDone(request_id=1, prompt_id=0, instance="i", turn=1, token_ids=np.asarray([9]),
                           num_tokens=6, finish_reason=0))  # fmt: skip
    facts.observe(_step(1, 1, [3]))
    facts.observe(TurnNext(request_id=1, turn=2, observation_token_ids=np.asarray([3]), max_tokens=4,
                           cut_to=3, num_cut=2))  # fmt: skip
    facts.observe(TurnDone(request_id=1, prompt_id=0, instance="i", turn=2, token_ids=np.asarray([4]),
                           num_tokens=6, finish_reason=0))  # fmt: skip
    facts.observe(SessionEnd(request_id=1, reward=1.0, acc=1.0, num_turns=3))
    good = _done(1, [5, 6, 7, 3, 4])
    facts.observe(good)
    assert check_sessions(facts, {0}).broken == []
    facts.observe(_done(1, [5, 6, 7, 8, 9, 3, 4]))  # the uncut tokens: not what the log says was trained
    assert check_sessions(facts, {0}).broken == [1]


def test_the_router_s_recovery_rebuilds_a_cut_prefix() -> None:
    prefix = SessionPrefix()
    prefix.turns = {0: _result([10, 11, 12], 0), 1: _result([13, 14], 1)}
    prefix.answers = {1: np.asarray([20, 21]), 2: np.asarray([22])}
    prefix.cuts = {1: -1, 2: 4}
    ids, logprobs, versions, mask = prefix.arrays(2)
    assert ids.tolist() == [10, 11, 12, 20, 22] and mask.tolist() == [1, 1, 1, 0, 0]
    assert versions.tolist() == [0, 0, 0, 0, 0] and logprobs.tolist() == [-0.5] * 3 + [0.0, 0.0]


def test_the_scheduler_s_recovery_keeps_each_turn_s_cut_and_the_resume_rule_checks_it() -> None:
    msgs = [
        TurnDone(request_id=1, prompt_id=0, instance="i", turn=0, token_ids=np.asarray([5]), num_tokens=3,
                 finish_reason=0),
        TurnNext(request_id=1, turn=1, observation_token_ids=np.asarray([7]), max_tokens=4, cut_to=0, num_cut=1),
    ]  # fmt: skip
    events = [Event(Envelope("k", 1, "session", 0, i + 1, 0, 0), m) for i, m in enumerate(msgs)]
    [restored] = rebuild_sessions(events, 0).sessions.values()
    assert restored.cuts == [(0, -1)] and restored.num_tokens == 3
    log = TurnLog([[], [7]], [True, True], [0], [None], [(-1, -1), (0, -1)])
    assert place(log, "1", 1, [7], 1, (0, -1)) == "wait"
    with pytest.raises(ResumeDivergedError, match=r"session 1 turn 1: .* \(-1, -1\) where its first run cut \(0, -1\)"):
        place(log, "1", 1, [7], 1, (-1, -1))
    with pytest.raises(ResumeDivergedError, match=r"\(0, 2\) where its first run cut \(0, -1\)"):
        place(log, "1", 1, [7], 1, (0, 2))  # the same tokens appended after another prompt cut


def _step(rid: int, turn: int, obs: list[int]) -> EnvStepDone:
    return EnvStepDone(request_id=rid, turn=turn, observation_token_ids=np.asarray(obs, np.int32))


def _done(rid: int, ids: list[int]) -> TrajectoryDone:
    n = len(ids)
    return TrajectoryDone(request_id=rid, prompt_id=0, v_traj=0, token_ids=np.asarray(ids, np.int32),
                          logprobs=np.zeros(n, np.float32), versions=np.zeros(n, np.int32),
                          finish_reason=FinishReason.STOP, instance="i", num_turns=3, env_reward=1.0)  # fmt: skip


def _result(ids: list[int], version: int) -> GenerateResult:
    return GenerateResult(request_id=1, prompt_id=0, token_ids=np.asarray(ids, np.int32),
                          logprobs=np.full(len(ids), -0.5, np.float32), versions=np.full(len(ids), version, np.int32),
                          finish_reason=FinishReason.STOP, instance="i")  # fmt: skip


# ---------------------------------------------------------------------- a scheduler restart around a branch

RID = 8
REPLIES = {1: [*encode("because"), 1], 2: [*encode("ans 7"), 1], 3: [*encode("ok"), 1]}


def _flow() -> SessionFlow:
    config = load_config("demo", [*OVERRIDES, "env.max_turns=5"])
    return SessionFlow(config, RecordingEnv(), gateway=build_gateway(config))


def _calls(flow: SessionFlow) -> list[list[dict[str, Any]]]:
    """The agent's calls after its first: continue, drop that reply and ask otherwise, go on from the branch."""
    text = flow.gateway.text  # type: ignore[union-attr]
    asked = [*ROW, {"role": "assistant", "content": "ans 6"}, {"role": "user", "content": "why"}]
    dropped = [*asked, {"role": "user", "content": "ans only"}]
    onward = [*dropped, {"role": "assistant", "content": text(REPLIES[2])}, {"role": "user", "content": "go"}]
    return [asked, dropped, onward]


def _first_run(generated_upto: int) -> Log:
    """A scheduler whose agent's turns 1..generated_upto were generated; its next call's turn generates at
    the crash."""
    flow, log = _flow(), Log()
    log.add("router.link", TurnStarted(request_id=RID, prompt_id=RID // 4, instance="i0", turn=0, num_tokens=10))
    logged(log, opened(flow, RID))
    log.add("router.link", turn_done(RID, 0, [*encode("ans 6"), 1]))
    chat(flow, 2, RID, ROW)
    for turn, messages in enumerate(_calls(flow)[: generated_upto + 1], start=1):
        logged(log, chat(flow, 10 + turn, RID, messages))
        if turn <= generated_upto:
            from_router(log, flow, turn_done(RID, turn, REPLIES[turn]))
    return log


def _restarted(log: Log) -> SessionFlow:
    flow = _flow()
    effects = flow.restore(rebuild_sessions(log.events, launch=0), 0.0)
    assert not sent(effects, TurnNext)
    flow.gateway_job(1, "open", "", {"request_id": RID, "messages": ROW, "tools": [],
                                     "prompt_token_ids": encode("user=sum 1 2 3 assistant=")}, 0.0)  # fmt: skip
    assert flow.answers.pop() == (1, {"id": str(RID), "object": "session"})
    chat(flow, 2, RID, ROW)
    flow.answers.clear()
    return flow


@pytest.mark.parametrize("generated_upto", [1, 2], ids=["during the branch's turn", "after it"])
def test_a_restarted_scheduler_resumes_a_branched_session(generated_upto: int) -> None:
    log = _first_run(generated_upto)
    [cut] = [e.message for e in log.events if isinstance(e.message, TurnNext) and e.message.cut_to >= 0]
    flow = _restarted(log)
    asked, dropped, onward = _calls(flow)
    assert chat(flow, 3, RID, asked) == []  # turn 1: from the log
    assert isinstance(flow.answers.pop()[1], Answer)
    assert chat(flow, 4, RID, dropped) == []  # the branch's turn: from the log, or waited for; never sent again
    if generated_upto == 1:
        assert flow.answers == []
        flow.handle(turn_done(RID, 2, REPLIES[2]), 0.0)
    (job, answer) = flow.answers.pop()
    assert job == 4 and answer.reply.message["content"] == flow.gateway.text(REPLIES[2])  # type: ignore[union-attr]
    effects = chat(flow, 5, RID, onward)  # it goes on from the branch, no cut
    if generated_upto == 1:  # past the log: a new turn
        [nxt] = sent(effects, TurnNext)
        assert nxt.turn == 3 and nxt.cut_to == -1 and not flow.sessions[RID].replaying
    else:  # the first run's call of turn 3 generates at the crash: the re-run's call waits for it
        assert effects == [] and flow.answers == []
        flow.handle(turn_done(RID, 3, REPLIES[3]), 0.0)
        assert flow.answers.pop()[0] == 5
    record = flow.gateway.record(str(RID))  # type: ignore[union-attr]
    assert record["current"] == 1 and len(record["trajectories"]) == 2
    assert flow.counters["turns_awaited" if generated_upto == 1 else "turns_replayed"] >= 1
    assert cut.turn == 2 and flow.counters["agents_diverged"] == 0


def test_a_restarted_router_rebuilds_a_cut_session_at_its_turn() -> None:
    log, flow = RecoveryLog(), _router()
    log.add("coordinator-router.link", request(0, 2))
    log.router(flow.handle(request(0, 2), 0.0))
    [first] = sent(log.router(flow.route(0.0)), GenerateRequest)
    where = flow.core.routed_instance(0) or ""
    turns = [
        TurnNext(request_id=0, turn=1, observation_token_ids=np.asarray([4], np.int32), max_tokens=5),
        TurnNext(request_id=0, turn=2, observation_token_ids=np.asarray([5, 5], np.int32), max_tokens=5,
                 cut_to=4, num_cut=2),
    ]  # fmt: skip
    req = first
    for number, nxt in enumerate(turns):
        log.add(f"{where}-router.link", finished := result(req, where, num_tokens=3 - number))
        log.router(flow.handle(finished, 1.0))
        log.add("session-router.link", nxt)
        [req] = sent(log.router(flow.handle(nxt, 2.0) + flow.route(2.0)), GenerateRequest)
    assert flow.tracker.live[0].token_ids.tolist() == [10, 11, 12, 4, 5, 5]  # turn 1's 10 11 cut away
    recovery = rebuild_router(log.events, LedgerSizes.from_config(flow_config()), launch=0)
    restarted = RouterFlow(flow_config(), recovery=recovery)
    assert not sent(restarted.start(3.0), SessionGone)  # rebuilt exactly, its cut applied
    session = restarted.tracker.live[0]
    assert session.turn == 2 and session.token_ids.tolist() == [10, 11, 12, 4, 5, 5]
    assert session.loss_mask.tolist() == [1, 1, 1, 0, 0, 0] and session.v_traj == req.pinned_version
    restarted.handle(status(where, seq=2), 3.1)
    out = restarted.handle(result(req, where, num_tokens=1), 3.2)
    [done] = sent(out, TurnDone)
    out = restarted.handle(SessionEnd(request_id=0, reward=1.0, acc=1.0, num_turns=3), 3.3) + restarted.status(3.4)
    [traj] = sent(out, TrajectoryDone)
    assert traj.token_ids.tolist() == [10, 11, 12, 4, 5, 5, *done.token_ids.tolist()]
