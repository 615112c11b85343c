"""Sticky sessions and new sessions: a continuing turn stays on its instance, a new session balances
against every session an instance holds (those generating and those resting at their tools)."""

from __future__ import annotations

import numpy as np

from bus.messages import GenerateRequest, SessionEnd, TurnNext
from psrl.config import load_config
from psrl.flows.router import RouterFlow
from tests.flows.flow_helpers import destinations, request, result, sent, status
from tests.routing.routing_helpers import make_core, peek, route
from tests.routing.routing_helpers import request as routing_request

STICKY = {"enable_trajectory_sticky": True}


def prompt_tokens(prompt: int, length: int = 64) -> tuple[int, ...]:
    return tuple(1000 * prompt + k for k in range(length))


def test_a_new_session_avoids_the_instance_its_resting_sessions_come_back_to() -> None:
    core = make_core("cache_aware_v1", versions=(0, 0), **STICKY)
    placed = route(core, *[routing_request(k, token_ids=prompt_tokens(k)) for k in range(4)])
    assert sorted(placed.values()) == ["i0", "i0", "i1", "i1"]
    for k in range(4):  # every turn ends; the sessions on i0 rest there, those on i1 end
        core.release(k)
    for k in (k for k, where in placed.items() if where == "i0"):
        core.rest(k, "i0")
    assert [c.num_resting for c in core.instances()] == [2, 0]
    # in flight both are empty: by requests alone the tie would go to i0
    assert peek(core, routing_request(10, token_ids=prompt_tokens(10))) == ("i1", "least_load")
    # the continuing turn of a resting session stays where its prefix is, however loaded that is
    resting = next(k for k, where in placed.items() if where == "i0")
    core.wake(resting)
    continuing = routing_request(
        resting, token_ids=(*prompt_tokens(resting), 5, 5), hint_instance="i0", is_sticky=True, version_tag=0
    )
    assert peek(core, continuing)[0] == "i0"
    assert [c.num_resting for c in core.instances()] == [1, 0]


def test_resting_sessions_leave_with_their_instance_and_waking_twice_is_harmless() -> None:
    core = make_core("cache_aware_v1", versions=(0, 0), **STICKY)
    core.rest(1, "i0")
    core.rest(1, "i1")  # moved: counted once, where it is now
    assert [c.num_resting for c in core.instances()] == [0, 1]
    core.remove_instance("i1")
    core.wake(1)
    core.wake(1)
    assert [c.num_resting for c in core.instances()] == [0]


def test_request_num_balance_ignores_resting_sessions() -> None:
    core = make_core("request_num_balance", versions=(0, 0))
    core.rest(1, "i0")
    core.rest(2, "i0")
    assert peek(core, routing_request(3))[0] == "i0"  # the baseline balances in-flight requests only


def _router() -> RouterFlow:
    config = load_config(
        "agentic",
        ["env.enable=true", "task.name=digit_chain", "psrl.staleness_buffer_entries=8", "psrl.rollout_n=1",
         "algorithm.adv_estimator=reinforce_plus_plus", "psrl.staleness=1", "actor.ppo_mini_batch_size=8"],
    )  # fmt: skip
    flow = RouterFlow(config)
    flow.start(0.0)
    for name in ("rollout-0", "rollout-1"):
        flow.handle(status(name), 0.0)
    return flow


def test_the_router_counts_a_session_resting_from_its_turn_end_to_its_next_turn_or_end() -> None:
    flow = _router()
    effects = flow.handle(request(0, 1), 0.0) + flow.route(0.0)
    [first] = sent(effects, GenerateRequest)
    [where] = destinations(effects, GenerateRequest)
    flow.handle(result(first, where, num_tokens=3), 1.0)  # the turn ends: the session rests there
    resting = {c.instance_id: c.num_resting for c in flow.core.instances()}
    assert resting[where] == 1 and sum(resting.values()) == 1
    # a new session goes to the other instance, though neither has a request in flight
    effects = flow.handle(request(1, 1), 1.5) + flow.route(1.5)
    [other] = destinations(effects, GenerateRequest)
    assert other != where
    flow.handle(TurnNext(request_id=0, turn=1, observation_token_ids=np.asarray([4, 5], np.int32), max_tokens=3), 2.0)
    effects = flow.route(2.0)
    assert destinations(effects, GenerateRequest) == [where]  # the continuing turn sticks
    assert {c.instance_id: c.num_resting for c in flow.core.instances()}[where] == 0
    [again] = sent(effects, GenerateRequest)
    flow.handle(result(again, where, num_tokens=2), 3.0)
    flow.handle(SessionEnd(request_id=0, reward=1.0, acc=1.0, num_turns=2), 4.0)
    assert all(c.num_resting == 0 for c in flow.core.instances())
