"""A run's session branching inside the row's prompt, part by part: the scheduler's gateway sends a
changed first message or a dropped first reply as a prompt cut (``TurnNext.prompt_keep``, the whole
response dropped), the router cuts its trajectory's prompt and hands the trajectory over with it
(``TrajectoryDone.prompt_keep``), the trainer's data carries that prompt, and the sessions checker
and both recoveries apply the cut."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from bus.arrays import encode_array
from bus.codec import Decoder
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
from psrl.coordination.chunks import Chunk
from psrl.coordination.groups import PromptGroup
from psrl.flows.router import RouterFlow
from psrl.flows.router_recovery import SessionPrefix, rebuild_router
from psrl.flows.session import SessionFlow
from psrl.flows.session_recovery import rebuild_sessions
from psrl.flows.train_data import train_data, trajectories_from
from psrl.gateway.sessions import Answer
from psrl.gateway.setup import build_gateway
from psrl.reliability.session_invariants import SessionFacts, check_sessions
from psrl.staleness.types import LedgerSizes
from psrl.tasks.base import Prompt, Reward
from tests.flows.flow_helpers import request, result, sent, status
from tests.flows.test_router_recovery import Log as RecoveryLog
from tests.sessions.test_gateway_resume import from_router, logged
from tests.sessions.test_router_sessions import _first_turn, _router, flow_config
from tests.sessions.test_session_flow import RecordingEnv
from tests.sessions.test_session_gateway import OVERRIDES, ROW, chat, encode, make, opened, turn_done
from tests.sessions.test_session_recovery import Log

PROMPT = [1, 2, 3]  # flow_helpers.request's prompt
TURN0 = [10, 11, 12]  # _first_turn's three generated tokens


def _prompt_cut(turn: int, keep: int, observation: list[int], num_cut: int) -> TurnNext:
    obs = np.asarray(observation, np.int32)
    return TurnNext(request_id=0, turn=turn, observation_token_ids=obs, max_tokens=5, cut_to=0, num_cut=num_cut,
                    prompt_keep=keep)  # fmt: skip


# ---------------------------------------------------------------------------------------------- the router


def test_the_router_cuts_the_prompt_drops_the_response_and_hands_over_the_kept_prompt() -> None:
    flow = _router()
    req, where, _ = _first_turn(flow)  # prompt 1 2 3, turn 0: 10 11 12
    flow.handle(_prompt_cut(1, 2, [7, 7], num_cut=1 + len(TURN0)), 2.0)
    [req1] = sent(flow.route(2.0), GenerateRequest)
    assert req1.prompt_token_ids.tolist() == [1, 2, 7, 7] and req1.pinned_version == req.pinned_version
    out = flow.handle(result(req1, where, num_tokens=2, version=1), 3.0)
    [done] = sent(out, TurnDone)
    assert done.num_tokens == 2 + 2 + 2  # the kept prompt, the observation, the turn
    assert flow.counters["session_prompt_cuts"] == 1 and flow.counters["session_tokens_cut"] == 4
    [end] = sent(flow.handle(SessionEnd(request_id=0, reward=1.0, acc=1.0, num_turns=2), 4.0), TrajectoryDone)
    assert end.prompt_keep == 2 and end.token_ids.tolist() == [7, 7, 10, 11]
    assert end.loss_mask.tolist() == [0, 0, 1, 1] and end.logprobs.tolist() == [0.0, 0.0, -0.5, -0.5]
    assert end.versions.tolist() == [0, 0, 1, 1]  # the observation: the pinned version (no token before it)


@pytest.mark.parametrize(
    ("keep", "cut_to", "why"),
    [(3, 0, "prompt_keep is 3; the prompt has 3 tokens"), (0, 0, "prompt_keep is 0"),
     (2, 1, "prompt_keep is 2 with cut_to 1: a cut inside the prompt drops the response")],
)  # fmt: skip
def test_a_prompt_cut_out_of_step_with_the_trajectory_fails_the_session_naming_it(
    keep: int, cut_to: int, why: str
) -> None:
    flow = _router()
    _first_turn(flow)
    bad = TurnNext(request_id=0, turn=1, observation_token_ids=np.asarray([1], np.int32), max_tokens=5,
                   cut_to=cut_to, prompt_keep=keep)  # fmt: skip
    out = flow.handle(bad, 2.0)
    [gone] = sent(out, SessionGone)
    assert f"turn 1: {why}" in gone.reason and flow.counters["bad_cuts"] == 1
    [ended] = sent(out, TrajectoryDone)
    assert ended.finish_reason == FinishReason.ERROR


def test_a_restarted_router_rebuilds_a_session_whose_prompt_was_cut() -> None:
    log, flow = RecoveryLog(), _router()
    log.add("coordinator-router.link", request(0, 2))
    log.router(flow.handle(request(0, 2), 0.0))
    [req] = sent(log.router(flow.route(0.0)), GenerateRequest)
    where = flow.core.routed_instance(0) or ""
    turns = [
        _prompt_cut(1, 2, [7, 7], num_cut=4),  # the first reply dropped: prompt 1 2, then 7 7
        TurnNext(request_id=0, turn=2, observation_token_ids=np.asarray([4], np.int32), max_tokens=5),
    ]
    for number, nxt in enumerate(turns):
        log.add(f"{where}-router.link", finished := result(req, where, num_tokens=3 - number))
        log.router(flow.handle(finished, 1.0))
        log.add("session-router.link", nxt)
        [req] = sent(log.router(flow.handle(nxt, 2.0) + flow.route(2.0)), GenerateRequest)
    live = flow.tracker.live[0]
    assert live.prompt_ids.tolist() == [1, 2] and live.token_ids.tolist() == [7, 7, 10, 11, 4]
    recovery = rebuild_router(log.events, LedgerSizes.from_config(flow_config()), launch=0)
    restarted = RouterFlow(flow_config(), recovery=recovery)
    assert not sent(restarted.start(3.0), SessionGone)  # rebuilt exactly, its prompt cut applied
    session = restarted.tracker.live[0]
    assert session.turn == 2 and session.prompt_ids.tolist() == [1, 2] and session.prompt_keep == 2
    assert session.token_ids.tolist() == live.token_ids.tolist() and session.loss_mask.tolist() == [0, 0, 1, 1, 0]
    assert session.versions.tolist() == live.versions.tolist() and session.logprobs.tolist() == live.logprobs.tolist()
    restarted.handle(status(where, seq=2), 3.1)
    out = restarted.handle(result(req, where, num_tokens=1), 3.2)
    [done] = sent(out, TurnDone)
    out = restarted.handle(SessionEnd(request_id=0, reward=1.0, acc=1.0, num_turns=3), 3.3) + restarted.status(3.4)
    [traj] = sent(out, TrajectoryDone)
    assert traj.prompt_keep == 2 and traj.token_ids.tolist() == [7, 7, 10, 11, 4, *done.token_ids.tolist()]


def test_the_router_s_recovery_gives_a_prompt_cut_prefix_its_prompt_and_the_pinned_version() -> None:
    prefix = SessionPrefix()
    prefix.turns = {0: _result([10, 11, 12], 2), 1: _result([13], 3)}
    prefix.answers = {1: np.asarray([20, 21]), 2: np.asarray([22])}
    prefix.cuts, prefix.prompt_keeps = {1: 0, 2: -1}, {1: 2, 2: -1}
    ids, _, versions, mask = prefix.arrays(2, pinned=2)
    assert ids.tolist() == [20, 21, 13, 22] and mask.tolist() == [0, 0, 1, 0]
    assert versions.tolist() == [2, 2, 3, 3]  # no token before the first answer: V_traj, as the router gives it
    assert prefix.prompt(np.asarray(PROMPT), 2).tolist() == [1, 2] and prefix.prompt_keep(0) == -1


# ------------------------------------------------------------------------------------------- the scheduler


@pytest.mark.parametrize(
    "edited",
    [[{"role": "user", "content": "sum 1 2 4"}], [*ROW, {"role": "user", "content": "why"}]],
    ids=["an edited first message", "a dropped first reply"],
)
def test_the_scheduler_sends_an_edit_of_the_row_s_prompt_as_a_prompt_cut(edited: list[dict[str, str]]) -> None:
    flow, _ = make()
    opened(flow, first="ans 6")
    chat(flow, 2, 8, ROW)  # the first call: the seeded turn
    flow.answers.clear()
    row_prompt, turn0 = encode("user=sum 1 2 3 assistant="), [*encode("ans 6"), 1]
    full = flow.gateway.template.render(edited, [], True)  # type: ignore[union-attr]
    tokens = encode(full)
    keep = next(i for i, (x, y) in enumerate(zip(row_prompt, tokens, strict=False)) if x != y)
    [cut] = sent(chat(flow, 3, 8, edited), TurnNext)
    assert 0 < keep < len(row_prompt) and (cut.turn, cut.cut_to, cut.prompt_keep) == (1, 0, keep)
    assert cut.observation_token_ids.tolist() == tokens[keep:]
    assert cut.num_cut == len(row_prompt) - keep + len(turn0) and flow.counters["branches"] == 1
    flow.handle(turn_done(8, 1, [*encode("ans 7"), 1]), 0.0)
    [(job, answer)] = flow.answers
    assert job == 3 and answer.reply.message["content"] == "ans 7"
    record = flow.gateway.record("8")  # type: ignore[union-attr]
    assert record["current"] == 1 and len(record["trajectories"]) == 2  # both recorded
    branch = record["trajectories"][1]
    assert branch["branch_of"] == 0 and branch["branch_at"] == keep
    assert branch["token_ids"] == [*tokens, *encode("ans 7"), 1]  # what the router's cut trajectory holds
    # the next call goes on from the branch: no cut, measured from the branch's own (cut) prompt
    onward = [*edited, {"role": "assistant", "content": "ans 7"}, {"role": "user", "content": "ok"}]
    flow.answers.clear()
    [nxt] = sent(chat(flow, 4, 8, onward), TurnNext)
    assert (nxt.cut_to, nxt.prompt_keep, nxt.num_cut) == (-1, -1, 0)


def test_a_dropped_reply_after_a_prompt_cut_cuts_the_branch_s_response() -> None:
    flow, _ = make()
    opened(flow, first="ans 6")
    chat(flow, 2, 8, ROW)
    edited = [*ROW, {"role": "user", "content": "why"}]
    [first_cut] = sent(chat(flow, 3, 8, edited), TurnNext)
    flow.handle(turn_done(8, 1, [*encode("ans 7"), 1]), 0.0)
    again = [*edited, {"role": "user", "content": "ans only"}]  # drops "ans 7": back into the branch's observation
    [cut] = sent(chat(flow, 4, 8, again), TurnNext)
    keep = first_cut.prompt_keep
    tokens = encode(flow.gateway.template.render(again, [], True))  # type: ignore[union-attr]
    branch = encode(flow.gateway.template.render(edited, [], True))  # type: ignore[union-attr]
    shared = next(i for i, (x, y) in enumerate(zip(branch, tokens, strict=False)) if x != y)
    assert cut.prompt_keep == -1 and keep < shared and cut.cut_to == shared - keep  # a response cut of the branch
    assert cut.observation_token_ids.tolist() == tokens[shared:]


# ---------------------------------------------------------------------------------- the trainer's data


def test_the_trainer_gets_a_prompt_cut_trajectory_with_its_own_prompt() -> None:
    group = PromptGroup(0, Prompt(0, "k", "t", "a"), np.asarray([1, 2, 3], np.int32))
    whole = _done(0, [5, 6], [1, 1])
    cut = _done(1, [7, 7, 8], [0, 0, 1], prompt_keep=2)
    group.results, group.winners = {0: whole, 1: cut}, (0, 1)
    group.rewards = {0: Reward(1.0, 1.0), 1: Reward(0.0, 0.0)}
    data = train_data(Chunk(0, 0, 1, (0,)), [group])
    assert data.prompt_lengths.tolist() == [3, 2] and data.prompt_token_ids.tolist() == [1, 2, 3, 1, 2]
    first, second = trajectories_from(data, 2)
    assert first.prompt_token_ids.tolist() == [1, 2, 3] and first.response_token_ids.tolist() == [5, 6]
    assert second.prompt_token_ids.tolist() == [1, 2] and second.response_token_ids.tolist() == [7, 7, 8]
    assert second.loss_mask.tolist() == [0, 0, 1]


# --------------------------------------------------------------------------------- the sessions checker


def test_the_sessions_checker_applies_prompt_cuts() -> None:
    facts = SessionFacts()
    for msg in [
        TurnDone(request_id=1, prompt_id=0, instance="i", turn=0, token_ids=np.asarray([5, 6]), num_tokens=5,
                 finish_reason=0),
        _step(1, 0, [7, 8]),
        TurnNext(request_id=1, turn=1, observation_token_ids=np.asarray([7, 8]), max_tokens=4, cut_to=0, num_cut=3,
                 prompt_keep=2),
        TurnDone(request_id=1, prompt_id=0, instance="i", turn=1, token_ids=np.asarray([9]), num_tokens=5,
                 finish_reason=0),
        SessionEnd(request_id=1, reward=1.0, acc=1.0, num_turns=2),
    ]:  # fmt: skip
        facts.observe(msg)
    facts.observe(_done(1, [7, 8, 9], [0, 0, 1], prompt_keep=2))
    assert check_sessions(facts, {0}).broken == []
    facts.observe(_done(1, [7, 8, 9], [0, 0, 1]))  # handed over with the group's whole prompt: not the branch
    assert check_sessions(facts, {0}).broken == [1]
    facts.observe(_done(1, [5, 6, 7, 8, 9], [1, 1, 0, 0, 1], prompt_keep=2))  # the response not dropped
    assert check_sessions(facts, {0}).broken == [1]


def test_the_scheduler_s_recovery_keeps_a_prompt_cut() -> None:
    msgs = [
        TurnDone(request_id=1, prompt_id=0, instance="i", turn=0, token_ids=np.asarray([5]), num_tokens=4,
                 finish_reason=0),
        TurnNext(request_id=1, turn=1, observation_token_ids=np.asarray([7, 7]), max_tokens=4, cut_to=0, num_cut=2,
                 prompt_keep=2),
    ]  # fmt: skip
    events = [Event(Envelope("k", 1, "session", 0, i + 1, 0, 0), m) for i, m in enumerate(msgs)]
    [restored] = rebuild_sessions(events, 0).sessions.values()
    assert restored.cuts == [(0, 2)] and restored.num_tokens == 4  # 1 2 (kept), 7 7


def _step(rid: int, turn: int, obs: list[int]) -> EnvStepDone:
    return EnvStepDone(request_id=rid, turn=turn, observation_token_ids=np.asarray(obs, np.int32))


def _result(ids: list[int], version: int) -> GenerateResult:
    return GenerateResult(request_id=1, prompt_id=0, token_ids=np.asarray(ids, np.int32),
                          logprobs=np.full(len(ids), -0.5, np.float32), versions=np.full(len(ids), version, np.int32),
                          finish_reason=FinishReason.STOP, instance="i")  # fmt: skip


def _done(rid: int, ids: list[int], mask: list[int], prompt_keep: int = -1) -> TrajectoryDone:
    n = len(ids)
    return TrajectoryDone(request_id=rid, prompt_id=0, v_traj=0, token_ids=np.asarray(ids, np.int32),
                          logprobs=np.zeros(n, np.float32), versions=np.zeros(n, np.int32),
                          finish_reason=FinishReason.STOP, instance="i", num_turns=2, env_reward=1.0,
                          loss_mask=np.asarray(mask, np.uint8), prompt_keep=prompt_keep)  # fmt: skip


# ------------------------------------------------------------------------- a scheduler restart around it

RID = 8
REPLIES = {1: [*encode("because"), 1], 2: [*encode("ans 7"), 1]}
ASKED = [*ROW, {"role": "assistant", "content": "ans 6"}, {"role": "user", "content": "why"}]
NO_FIRST = [*ROW, {"role": "user", "content": "ans only"}]  # the first reply dropped: a prompt cut


def _scheduler() -> SessionFlow:
    config = load_config("demo", [*OVERRIDES, "env.max_turns=5"])
    return SessionFlow(config, RecordingEnv(), gateway=build_gateway(config))


def _first_life(generated_upto: int) -> Log:
    flow, log = _scheduler(), Log()
    log.add("router.link", TurnStarted(request_id=RID, prompt_id=RID // 4, instance="i0", turn=0, num_tokens=10))
    logged(log, opened(flow, RID))
    log.add("router.link", turn_done(RID, 0, [*encode("ans 6"), 1]))
    chat(flow, 2, RID, ROW)
    for turn, messages in enumerate([ASKED, NO_FIRST][: generated_upto + 1], start=1):
        logged(log, chat(flow, 10 + turn, RID, messages))
        if turn <= generated_upto:
            from_router(log, flow, turn_done(RID, turn, REPLIES[turn]))
    return log


@pytest.mark.parametrize("generated_upto", [1, 2], ids=["during the branch's turn", "after it"])
def test_a_restarted_scheduler_resumes_a_session_branched_inside_its_prompt(generated_upto: int) -> None:
    log = _first_life(generated_upto)
    [cut] = [e.message for e in log.events if isinstance(e.message, TurnNext) and e.message.prompt_keep >= 0]
    flow = _scheduler()
    assert not sent(flow.restore(rebuild_sessions(log.events, launch=0), 0.0), TurnNext)
    assert flow.sessions[RID].turn_log.cuts[2] == (0, cut.prompt_keep)
    flow.gateway_job(1, "open", "", {"request_id": RID, "messages": ROW, "tools": [],
                                     "prompt_token_ids": encode("user=sum 1 2 3 assistant=")}, 0.0)  # fmt: skip
    chat(flow, 2, RID, ROW)
    assert chat(flow, 3, RID, ASKED) == []  # turn 1: from the log
    assert chat(flow, 4, RID, NO_FIRST) == []  # the prompt cut's turn: the same cut, never sent again
    if generated_upto == 1:
        flow.handle(turn_done(RID, 2, REPLIES[2]), 0.0)
    (job, answer) = flow.answers.pop()
    assert job == 4 and isinstance(answer, Answer) and flow.counters["agents_diverged"] == 0
    assert flow.gateway.sessions[str(RID)].prompt_len == cut.prompt_keep  # type: ignore[union-attr]
    onward = [*NO_FIRST, {"role": "assistant", "content": flow.gateway.text(REPLIES[2])}]  # type: ignore[union-attr]
    [nxt] = sent(chat(flow, 5, RID, [*onward, {"role": "user", "content": "go"}]), TurnNext)
    assert (nxt.turn, nxt.cut_to, nxt.prompt_keep) == (3, -1, -1)  # it goes on from the branch, no cut


# ------------------------------------------------------------------------------------------- older logs


@pytest.mark.parametrize("kind", [TurnNext, TrajectoryDone])
def test_a_1_13_event_without_prompt_keep_reads_as_the_group_s_whole_prompt(kind: type) -> None:
    message = TurnNext(request_id=0, turn=1, observation_token_ids=np.asarray([4], np.int32), max_tokens=5,
                       cut_to=2, num_cut=1, prompt_keep=2) if kind is TurnNext else _done(0, [5], [1], 2)  # fmt: skip
    fields = msgspec.structs.astuple(message)[:-1]  # the message as protocol 1.13 wrote it
    envelope = Envelope(kind.KIND, 1, "writer", 0, 1, 2, 3)
    body = msgspec.msgpack.Encoder(enc_hook=lambda a: encode_array(a, [], 1 << 20)).encode([(envelope, fields)])
    old = Decoder().decode_one([kind.KIND_BYTES, body]).message
    assert isinstance(old, kind) and old.prompt_keep == -1
