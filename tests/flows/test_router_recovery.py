"""A router restarted mid-run: its state rebuilt from the log of its predecessor's life, by the documented rule."""

from __future__ import annotations

from typing import Any

import numpy as np

from bus.messages import Abort, GenerateRequest, GroupAccept, GroupFinished, LedgerOp, RouterStatus, TrajectoryDone
from bus.schema import Event
from bus.stamp import Stamper
from psrl.config import load_config
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.router import RECALL_TIMEOUT_S, RouterFlow
from psrl.flows.router_recovery import RECALL, RouterRecovery, rebuild_router
from psrl.staleness.log_replay import LedgerReplay
from psrl.staleness.types import LedgerSizes
from tests.flows.flow_helpers import LoggedEvents, request, result, sent, status

SMALL = ["psrl.staleness_buffer_entries=2", "psrl.rollout_n=2", "psrl.staleness=1", "actor.ppo_mini_batch_size=2"]
N = 2


class Log(LoggedEvents):
    """The event log of a router's life: its effects, the coordinator's and the instances' messages."""

    def __init__(self, router_incarnation: int = 0) -> None:
        super().__init__()
        self.router_incarnation = router_incarnation

    def router(self, effects: list[Effect]) -> list[Effect]:
        for effect in effects:
            if isinstance(effect, Send | Publish):
                sender = "router.link" if isinstance(effect, Send) else "router"
                self.add(sender, effect.message, self.router_incarnation)
        return effects


def _config() -> Any:
    return load_config("demo", SMALL)


def _first_life() -> tuple[Log, RouterFlow, list[GenerateRequest]]:
    """Two prompt groups routed; child 0 of each finished, child 1 still running when the router dies."""
    log, flow = Log(), RouterFlow(_config())
    log.router(flow.start(0.0))
    for name in ("rollout-0", "rollout-1"):
        log.router(flow.handle(status(name), 0.0))
    for rid in range(4):
        log.add("coordinator-router.link", request(rid, N))
        log.router(flow.handle(request(rid, N), 0.0))
    dispatched = sent(log.router(flow.route(0.0)), GenerateRequest)
    assert len(dispatched) == 4
    for req in dispatched:
        if req.request_id % N == 0:
            instance = flow.core.routed_instance(req.request_id) or ""
            log.add(f"{instance}-router.link", finished := result(req, instance, num_tokens=8))
            log.router(flow.handle(finished, 1.0))
    return log, flow, dispatched


def _restart(log: Log, **changes: Any) -> tuple[RouterFlow, RouterRecovery, list[Effect]]:
    recovery = rebuild_router(log.events, LedgerSizes.from_config(_config()), launch=0)
    flow = RouterFlow(_config(), recovery=recovery)
    effects = flow.start(2.0)
    return flow, recovery, effects


def test_the_rebuilt_ledger_is_the_dead_routers_and_running_requests_are_recalled() -> None:
    log, dead, _ = _first_life()
    flow, recovery, effects = _restart(log)
    assert recovery.ledger.counts() == dead.ledger.counts()
    assert sorted(recovery.requests) == [1, 3] and recovery.num_recalled == 2
    assert [m.recovered for m in (e.message for e in effects) if isinstance(m, RouterStatus)] == [True]
    # the instances are asked for their requests once they are connected (their first status)
    recalls = []
    for name in ("rollout-0", "rollout-1"):
        recalls += sent(flow.handle(status(name, seq=2), 2.1), Abort)
    assert sorted(r for a in recalls for r in a.request_ids) == [1, 3] and {a.reason for a in recalls} == {RECALL}


def test_a_recalled_request_continues_from_the_tokens_its_instance_returns() -> None:
    log, dead, dispatched = _first_life()
    where = {rid: dead.core.routed_instance(rid) for rid in (1, 3)}
    flow, _, _ = _restart(log)
    for name in ("rollout-0", "rollout-1"):
        flow.handle(status(name, seq=2), 2.1)
    req = next(r for r in dispatched if r.request_id == 1)
    flow.handle(result(req, where[1] or "", num_tokens=5, error=RECALL), 2.2)
    again = sent(flow.route(2.3), GenerateRequest)
    assert [r.request_id for r in again] == [1]
    assert again[0].generated_token_ids.tolist() == list(range(10, 15)) and again[0].pinned_version == 0
    # an answer from an instance the request is no longer at is not its result
    before = dict(flow.counters)
    flow.handle(result(req, "rollout-9", num_tokens=8), 2.4)
    assert flow.counters["stale_results"] == before.get("stale_results", 0) + 1


def test_a_recall_nobody_answers_continues_from_the_last_dispatch() -> None:
    log, _, _ = _first_life()
    flow, _, _ = _restart(log)
    for name in ("rollout-0", "rollout-1"):
        flow.handle(status(name, seq=2), 2.1)
    flow.status(2.2)
    assert sorted(flow.recalled) == [1, 3]
    flow.status(2.2 + RECALL_TIMEOUT_S + 0.1)
    assert not flow.recalled and flow.counters["recalls_unanswered"] == 2
    again = sent(flow.route(20.0), GenerateRequest)
    assert sorted(r.request_id for r in again) == [1, 3] and all(r.pinned_version == 0 for r in again)


def test_a_result_logged_but_never_handled_is_handled_by_the_new_router() -> None:
    log, dead, dispatched = _first_life()
    req = next(r for r in dispatched if r.request_id == 1)
    instance = dead.core.routed_instance(1) or ""
    log.add(f"{instance}-router.link", result(req, instance, num_tokens=8))  # the router died before reading it
    flow, recovery, effects = _restart(log)
    assert sorted(recovery.requests) == [1, 3] and recovery.num_recalled == 1
    done = [m for m in (e.message for e in effects) if isinstance(m, TrajectoryDone)]
    completes = [m for m in (e.message for e in effects) if isinstance(m, GroupFinished)]
    assert not done and not completes, "held until the coordinator can be reached"
    released = flow.status(2.5)
    assert [m.request_id for m in sent(released, TrajectoryDone)] == [1]
    assert [m.prompt_id for m in sent(released, GroupFinished)] == [0]
    ops = [e.message for e in effects if isinstance(e, Publish) and isinstance(e.message, LedgerOp)]
    assert [(op.op, op.prompt_id, op.child) for op in ops] == [("finish", 0, 1)]


def test_coordinator_commands_are_handled_once_whether_or_not_the_dead_router_got_them() -> None:
    log, dead, dispatched = _first_life()
    for req in dispatched:
        if req.request_id % N == 1:
            instance = dead.core.routed_instance(req.request_id) or ""
            log.add(f"{instance}-router.link", finished := result(req, instance, num_tokens=8))
            log.router(dead.handle(finished, 1.5))
    handled = log.add("coordinator-router.link", GroupAccept(prompt_id=0, request_ids=[0, 1]))
    for effect in dead.handle(handled.message, 1.6):  # handled: what it logged names the command as parent
        if isinstance(effect, Publish):
            log.events.append(Event(log.stampers.setdefault("router#0", Stamper("router", 0)).stamp(
                effect.message, parent=handled.envelope.event_id), effect.message))  # fmt: skip
    unhandled = log.add("coordinator-router.link", GroupAccept(prompt_id=1, request_ids=[2, 3]))
    flow, recovery, effects = _restart(log)
    assert [c.prompt_id for c in recovery.commands] == [1]
    assert {handled.envelope.event_id, unhandled.envelope.event_id} <= recovery.seen_event_ids
    ops = [(e.message.op, e.message.prompt_id) for e in effects if isinstance(e.message, LedgerOp)]
    assert ops == [("occupy", 1)]
    assert flow.ledger.counts() != dead.ledger.counts()  # the new router did what the dead one never did


def test_the_ledger_checker_continues_a_recovered_router_and_restarts_a_fresh_one() -> None:
    sizes = LedgerSizes.from_config(_config())
    log, dead, _ = _first_life()
    replay = LedgerReplay(sizes)
    for event in log.events:
        replay.observe(event)
    before = replay.current().counts()
    assert before == dead.ledger.counts()
    after_crash = Log(router_incarnation=1)
    replay.observe(after_crash.add("router", RouterStatus(0, 0, [], [], [], next_buffer=0, recovered=True), 1))
    assert replay.current().counts() == before
    replay.observe(after_crash.add("router", RouterStatus(0, 0, [], [], [], next_buffer=3), 1000))
    assert replay.current().counts().next_buffer_id == 3 and replay.current().counts().num_in_flight == 0


def test_tokens_of_a_restored_trajectory_are_those_of_its_last_dispatch() -> None:
    log, dead, dispatched = _first_life()
    req = next(r for r in dispatched if r.request_id == 1)
    instance = dead.core.routed_instance(1) or ""
    log.add(f"{instance}-router.link", interrupted := result(req, instance, num_tokens=6, error="sync"))
    log.router(dead.handle(interrupted, 1.7))
    log.router(dead.route(1.8))  # continued: the dispatch carries its 6 tokens
    flow, recovery, _ = _restart(log)
    traj = flow.tracker.live[1]
    assert traj.token_ids.tolist() == list(range(10, 16)) and np.all(traj.versions == 0)
    assert recovery.requests[1].dispatch is not None


def test_requests_of_an_instance_that_never_reconnects_are_continued_elsewhere() -> None:
    log, dead, _ = _first_life()
    gone = dead.core.routed_instance(1) or ""
    flow, _, _ = _restart(log)
    other = next(name for name in ("rollout-0", "rollout-1") if name != gone)
    flow.handle(status(other, seq=2), 2.1)
    flow.status(2.2 + RECALL_TIMEOUT_S + 0.1)
    assert not flow.recalled and not flow.recalls_pending
    assert 1 in {r.request_id for r in sent(flow.route(20.0), GenerateRequest)}


def test_a_log_that_lost_events_says_so() -> None:
    log, _, _ = _first_life()
    whole = rebuild_router(log.events, LedgerSizes.from_config(_config()), launch=0)
    assert whole.num_missing_events == 0
    router_events = [i for i, e in enumerate(log.events) if e.envelope.sender == "router"]
    del log.events[router_events[len(router_events) // 2]]
    torn = rebuild_router(log.events, LedgerSizes.from_config(_config()), launch=0)
    assert torn.num_missing_events == 1


def test_a_requests_dispatch_and_end_logged_before_the_request_itself_are_taken_in_order() -> None:
    """Events of different senders meet at the proxy in any order: the router's dispatch, the
    instance's result and the router's hand-back of a request can reach the log before the
    coordinator's request. A request handed back is not alive (found by `make chaos-full`: a finished
    request restored as queued took a staleness slot no group would fill, and the run stalled); one
    dispatched is recalled, not sent again from scratch."""
    log, _, _ = _first_life()
    requests = [e for e in log.events if e.envelope.sender == "coordinator-router.link"]
    log.events = [e for e in log.events if e.envelope.sender != "coordinator-router.link"] + requests
    recovery = rebuild_router(log.events, LedgerSizes.from_config(_config()), launch=0)
    assert sorted(recovery.requests) == [1, 3] and recovery.num_recalled == 2
    assert all(r.dispatch is not None for r in recovery.requests.values())


def test_a_rebuilt_router_takes_no_request_id_twice() -> None:
    """Every id the coordinator is logged sending, finished or alive, is taken: a copy of one (a
    restarted coordinator's resend) is dropped by the new router too."""
    log, _, _ = _first_life()
    flow, recovery, _ = _restart(log)
    assert all(recovery.taken.has(request(rid, N)) for rid in range(4)) and not recovery.taken.has(request(4, N))
    for name in ("rollout-0", "rollout-1"):
        flow.handle(status(name, seq=2), 2.1)
    for rid in (0, 1):  # finished in the dead router; recalled in this one
        assert sent(flow.handle(request(rid, N), 2.2) + flow.route(2.2), GenerateRequest) == []
    assert flow.counters["duplicate_requests"] == 2


def test_a_logged_command_the_dead_router_never_handled_is_handled_once() -> None:
    """The rebuilt router handles it from the log; the copy a restarted coordinator sends is dropped."""
    log, _, _ = _first_life()
    accept = GroupAccept(prompt_id=0, request_ids=[0])
    log.add("coordinator-router.link", accept)  # the router died before handling it: nothing names it
    flow, recovery, _ = _restart(log)
    assert recovery.commands == [accept] and flow.taken.has(accept)
    assert flow.handle(accept, 3.0) == [] and flow.counters["duplicate_commands"] == 1
