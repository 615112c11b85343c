"""The router's side of sessions: turns go to the session scheduler, next turns come back sticky with
the environment's tokens as prompt, the end finishes the trajectory with the environment's reward."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from bus.messages import (
    ActorExited,
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
from bus.schema import Event
from psrl.config import load_config
from psrl.flows.effects import Send
from psrl.flows.router import RouterFlow
from psrl.flows.router_recovery import SESSION_NOT_REBUILT, rebuild_router
from psrl.staleness.types import LedgerSizes
from tests.flows.flow_helpers import destinations, request, result, sent, status
from tests.flows.test_router_recovery import Log as RecoveryLog

CONFIG = ["env.enable=true", "task.name=digit_chain", "psrl.staleness_buffer_entries=2", "psrl.rollout_n=2",
          "psrl.staleness=1", "actor.ppo_mini_batch_size=2"]  # fmt: skip


def flow_config() -> Any:
    return load_config("agentic", CONFIG)


def _router() -> RouterFlow:
    flow = RouterFlow(flow_config())
    flow.start(0.0)
    for name in ("rollout-0", "rollout-1"):
        flow.handle(status(name), 0.0)
    return flow


def _first_turn(flow: RouterFlow) -> tuple[GenerateRequest, str, list]:
    effects = flow.handle(request(0, 2), 0.0) + flow.route(0.0)
    [req] = sent(effects, GenerateRequest)
    [where] = destinations(effects, GenerateRequest)
    assert sent(effects, TurnStarted)[0].instance == where
    out = flow.handle(result(req, where, num_tokens=3), 1.0)
    return req, where, out


def test_a_turn_goes_to_the_scheduler_and_the_next_turn_returns_sticky_with_the_environments_tokens() -> None:
    flow = _router()
    req, where, out = _first_turn(flow)
    [done] = sent(out, TurnDone)
    assert not sent(out, TrajectoryDone) and done.turn == 0 and flow.tracker.live[0].in_env
    observation = np.asarray([15, 18, 4], np.int32)
    flow.handle(TurnNext(request_id=0, turn=1, observation_token_ids=observation, max_tokens=5), 2.0)
    effects = flow.route(2.0)
    [again] = sent(effects, GenerateRequest)
    assert destinations(effects, GenerateRequest) == [where]  # sticky
    expected_prompt = np.concatenate([req.prompt_token_ids, done.token_ids, observation])
    assert again.prompt_token_ids.tolist() == expected_prompt.tolist() and again.generated_token_ids is None
    assert again.sampling.max_tokens == 5 and again.pinned_version == 0
    out = flow.handle(result(again, where, num_tokens=2), 3.0)
    assert sent(out, TurnDone)[0].token_ids.tolist() == result(again, where, num_tokens=2).token_ids.tolist()
    out = flow.handle(SessionEnd(request_id=0, reward=0.75, acc=1.0, num_turns=2), 4.0)
    [traj] = sent(out, TrajectoryDone)
    assert traj.env_reward == 0.75 and traj.num_turns == 2 and traj.finish_reason == FinishReason.STOP
    assert traj.loss_mask.tolist() == [1] * 3 + [0] * 3 + [1] * 2


def test_a_failed_session_fails_its_trajectory() -> None:
    flow = _router()
    _first_turn(flow)
    out = flow.handle(SessionEnd(request_id=0, reward=0.0, acc=0.0, num_turns=1, error="tool exploded"), 2.0)
    [traj] = sent(out, TrajectoryDone)
    assert traj.finish_reason == FinishReason.ERROR and "tool exploded" in traj.error


def test_a_lost_scheduler_keeps_its_sessions_waiting_and_its_replacement_gets_what_it_missed_in_order() -> None:
    flow = _router()
    _, where, out = _first_turn(flow)
    [done] = sent(out, TurnDone)
    out = flow.handle(ActorExited(actor="session", incarnation=0, returncode=-9), 2.0)
    assert not sent(out, TrajectoryDone) and flow.tracker.live[0].in_env  # the replacement rebuilds it
    assert flow.undeliverable(Send("session", done, request_id=0), 2.1) == []  # nobody listening: held
    effects = flow.handle(request(1, 2), 2.2) + flow.route(2.2)
    assert sent(effects, GenerateRequest) and not sent(effects, TurnStarted)  # held behind the TurnDone
    out = flow.status(3.0)
    held = [e for e in out if isinstance(e, Send) and e.to == "session"]
    assert [type(e.message) for e in held] == [TurnDone, TurnStarted]  # sent again, in order
    assert flow.held_sessions == []
    flow.handle(TurnNext(request_id=0, turn=1, observation_token_ids=np.asarray([4], np.int32), max_tokens=5), 4.0)
    effects = flow.route(4.0)
    assert sent(effects, GenerateRequest)[0].request_id == 0 and destinations(effects, GenerateRequest)[0] == where


def _first_life() -> tuple[RecoveryLog, RouterFlow, dict[int, GenerateRequest]]:
    """Sessions 0 and 1 finish their first turn; 0 goes on to its second turn, 1 waits at its environment."""
    log, flow = RecoveryLog(), _router()
    for rid in (0, 1):
        log.add("coordinator-router.link", request(rid, 2))
        log.router(flow.handle(request(rid, 2), 0.0))
    dispatched = {r.request_id: r for r in sent(log.router(flow.route(0.0)), GenerateRequest)}
    for rid, req in dispatched.items():
        where = flow.core.routed_instance(rid) or ""
        log.add(f"{where}-router.link", finished := result(req, where, num_tokens=3))
        log.router(flow.handle(finished, 1.0))
    nxt = TurnNext(request_id=0, turn=1, observation_token_ids=np.asarray([4], np.int32), max_tokens=5)
    log.add("session-router.link", nxt)
    dispatched.update(
        (r.request_id, r) for r in sent(log.router(flow.handle(nxt, 2.0) + flow.route(2.0)), GenerateRequest)
    )
    return log, flow, dispatched


def _restart(log: RecoveryLog) -> tuple[RouterFlow, list]:
    recovery = rebuild_router(log.events, LedgerSizes.from_config(flow_config()), launch=0)
    restarted = RouterFlow(flow_config(), recovery=recovery)
    return restarted, restarted.start(3.0)


def test_a_restarted_router_rebuilds_each_session_at_its_turn_and_hands_a_finished_turn_over_again() -> None:
    log, dead, dispatched = _first_life()
    where = dead.core.routed_instance(0) or ""
    restarted, effects = _restart(log)
    assert not sent(effects, SessionGone)
    [again] = sent(effects, TurnDone)  # session 1's first turn, from its logged result, handed over again
    assert again.request_id == 1 and again.turn == 0 and again.token_ids.tolist() == [10, 11, 12]
    session = restarted.tracker.live[0]  # session 0: its first turn and the answer, then its second turn
    assert session.turn == 1 and session.turn_start == 4 and session.token_ids.tolist() == [10, 11, 12, 4]
    assert session.loss_mask.tolist() == [1, 1, 1, 0] and session.logprobs[3] == 0.0
    restarted.handle(status(where, seq=2), 3.1)  # recalled from its instance once that is connected
    second = dispatched[0]
    assert second.prompt_token_ids.tolist()[-4:] == [10, 11, 12, 4]
    out = restarted.handle(result(second, where, num_tokens=2), 3.2)
    [done] = sent(out, TurnDone)
    assert done.turn == 1 and done.token_ids.tolist() == result(second, where, num_tokens=2).token_ids.tolist()
    out = restarted.handle(SessionEnd(request_id=0, reward=1.0, acc=1.0, num_turns=2), 3.3)
    out += restarted.status(3.4)
    [traj] = [t for t in sent(out, TrajectoryDone) if t.request_id == 0]
    assert traj.token_ids.tolist() == [10, 11, 12, 4, *done.token_ids.tolist()]
    assert traj.loss_mask.tolist() == [1, 1, 1, 0, 1, 1] and traj.num_turns == 2


def test_a_session_whose_turns_the_log_does_not_give_exactly_fails_by_the_rule() -> None:
    log, _, _ = _first_life()
    for k, event in enumerate(log.events):  # the handed-over turn is not the instance's result
        if isinstance(event.message, TurnDone) and event.message.request_id == 0:
            log.events[k] = Event(event.envelope, msgspec.structs.replace(event.message, token_ids=np.asarray([9])))
    restarted, effects = _restart(log)
    [gone] = sent(effects, SessionGone)
    assert gone.request_id == 0 and gone.reason == SESSION_NOT_REBUILT
    [failed] = sent(restarted.status(3.5), TrajectoryDone)  # to the coordinator once it can be reached
    assert failed.request_id == 0 and failed.finish_reason == FinishReason.ERROR and failed.error == SESSION_NOT_REBUILT


def test_a_handed_over_turn_logged_before_the_instances_result_is_still_rebuilt() -> None:
    log, _, _ = _first_life()
    kinds = [(type(e.message), getattr(e.message, "request_id", None)) for e in log.events]
    done, result_at = kinds.index((TurnDone, 0)), kinds.index((GenerateResult, 0))
    assert result_at < done
    log.events.insert(result_at, log.events.pop(done))  # the events of two senders meet at the proxy in any order
    restarted, effects = _restart(log)
    assert not sent(effects, SessionGone)
    assert restarted.tracker.live[0].turn == 1 and restarted.tracker.live[0].token_ids.tolist() == [10, 11, 12, 4]
