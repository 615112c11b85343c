"""The coordinator and then the router killed: what the router held for the unreachable coordinator.

A router logs a message for the coordinator only once it is delivered, so a finished trajectory it
counted in the ledger but held (the coordinator was down) dies with it. The replacement rebuilds
the ledger, in which that finish is already counted, and must deliver the trajectory (and the
group's ``group.finished`` when that finish completed the group) itself; the coordinator takes each
result and verdict once, whoever delivers it. Found by ``tools/chaos.py --roles router,coordinator
--seed 6``.
"""

from __future__ import annotations

from typing import Any

from bus.messages import GenerateRequest, GroupAccept, GroupFinished, LedgerOp, Occupy, TrajectoryDone
from bus.schema import Message
from psrl.config import load_config
from psrl.flows.coordinator import CoordinatorFlow
from psrl.flows.coordinator_recovery import replay_coordinator
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.router import RouterFlow
from psrl.flows.router_recovery import rebuild_router
from psrl.staleness.types import LedgerSizes
from tests.flows.flow_helpers import FixedPrompts, LoggedEvents, done, result, status

SMALL = ["psrl.staleness_buffer_entries=2", "psrl.rollout_n=2", "psrl.staleness=1", "actor.ppo_mini_batch_size=2"]
N = 2
INSTANCES = ("rollout-0", "rollout-1")


def _config() -> Any:
    return load_config("demo", SMALL)


def _coordinator() -> CoordinatorFlow:
    prompts = FixedPrompts()
    return CoordinatorFlow(_config(), prompts, prompts)


class Run(LoggedEvents):
    """A router and a coordinator on one log. A router message for a dead coordinator is not delivered
    (the router's link refuses it: it goes back to the flow, which holds it) and so not logged."""

    def __init__(self) -> None:
        super().__init__()
        self.router = RouterFlow(_config())
        self.coordinator: CoordinatorFlow | None = _coordinator()
        self.incarnations = {"router": 0, "coordinator": 0}
        self.to_router: list[Message] = []  # sent by the coordinator, not yet handled by the router
        self.dispatched: dict[int, GenerateRequest] = {}  # each request's last dispatch to an instance

    def from_router(self, effects: list[Effect], now: float = 1.0) -> None:
        incarnation = self.incarnations["router"]
        for effect in effects:
            if isinstance(effect, Publish):
                self.add("router", effect.message, incarnation)
            elif isinstance(effect, Send) and effect.to == "coordinator" and self.coordinator is None:
                self.from_router(self.router.undeliverable(effect, now), now)
            elif isinstance(effect, Send):
                self.add("router.link", effect.message, incarnation)
                if effect.to == "coordinator" and self.coordinator is not None:
                    self.from_coordinator(self.coordinator.handle(effect.message, now))
                elif isinstance(effect.message, GenerateRequest):
                    self.dispatched[effect.message.request_id] = effect.message

    def from_coordinator(self, effects: list[Effect]) -> None:
        incarnation = self.incarnations["coordinator"]
        for effect in effects:
            if isinstance(effect, Send) and effect.message.LOGGED:
                self.add(f"coordinator-{effect.to}.link", effect.message, incarnation)
                if effect.to == "router":
                    self.to_router.append(effect.message)
            elif isinstance(effect, Publish):
                self.add("coordinator", effect.message, incarnation)

    def pump(self, now: float = 1.0) -> None:
        """The router handles what the coordinator sent it, then routes."""
        while self.to_router:
            self.from_router(self.router.handle(self.to_router.pop(0), now), now)
        self.from_router(self.router.route(now), now)

    def finish(self, request_id: int, now: float = 1.0, *, logged: bool = True) -> None:
        """The instance running ``request_id`` hands it back finished (logged as its link sends it)."""
        req = self.dispatched[request_id]
        instance = self.router.core.routed_instance(request_id) or self.router.recalled.get(request_id, "")
        answer = result(req, instance, num_tokens=4 + request_id)
        if logged:
            self.add(f"{instance}-router.link", answer)
        self.from_router(self.router.handle(answer, now), now)

    def kill_coordinator(self) -> None:
        self.coordinator = None

    def restart_coordinator(self, now: float) -> None:
        self.incarnations["coordinator"] += 1
        flow = _coordinator()
        recovery = replay_coordinator(flow, self.events, launch=0, now=now)
        self.coordinator = flow
        self.from_coordinator(recovery.effects)

    def restart_router(self, now: float) -> None:
        """The replacement rebuilds from the log; the coordinator's messages already there are the ones
        it takes from the log (its link drops them when they are delivered too)."""
        self.incarnations["router"] += 1
        recovery = rebuild_router(self.events, LedgerSizes.from_config(_config()), launch=0)
        self.to_router.clear()
        self.router = RouterFlow(_config(), recovery=recovery)
        self.from_router(self.router.start(now), now)
        for name in INSTANCES:
            self.from_router(self.router.handle(status(name, seq=2), now), now)
        self.from_router(self.router.status(now + 0.1), now)  # the held messages go on the first tick

    def logged(self, kind: type, sender: str) -> list[Any]:
        return [e.message for e in self.events if isinstance(e.message, kind) and e.envelope.sender == sender]


def _started() -> Run:
    """The coordinator's first groups routed to two instances."""
    run = Run()
    run.from_router(run.router.start(0.0), 0.0)
    for name in INSTANCES:
        run.from_router(run.router.handle(status(name), 0.0), 0.0)
    assert run.coordinator is not None
    run.from_coordinator(run.coordinator.start(0.0))
    run.pump()
    assert {0, 1, 2, 3} <= set(run.dispatched)
    return run


def _finishes_of(run: Run, prompt_id: int, child: int) -> list[LedgerOp]:
    ops = run.logged(LedgerOp, "router")
    return [op for op in ops if (op.op, op.prompt_id, op.child) == ("finish", prompt_id, child)]


def _assert_group_kept_once(run: Run, coordinator: CoordinatorFlow, prompt_id: int) -> None:
    """The group has all N results and went back to the router once, which occupied its slot."""
    group = coordinator.book.groups[prompt_id]
    assert sorted(group.results) == [prompt_id * N + c for c in range(N)] and group.is_settled
    commands = [m for m in run.logged(GroupAccept, "coordinator-router.link") if m.prompt_id == prompt_id]
    assert len(commands) == 1
    run.pump(3.0)
    assert group.buffer is not None
    assert [o.prompt_id for o in run.logged(Occupy, "router.link")].count(prompt_id) == 1
    for child in range(N):
        assert len(_finishes_of(run, prompt_id, child)) == 1, "each finish is counted in the ledger once"


def test_a_held_trajectory_that_completed_its_group_is_delivered_by_the_replacement() -> None:
    run = _started()
    run.finish(0)  # delivered: the coordinator has child 0
    run.kill_coordinator()
    run.finish(1)  # counted (the group is complete) and held: trajectory and group.finished
    assert not [m for m in run.logged(TrajectoryDone, "router.link") if m.request_id == 1]
    assert run.router.held, "held for the unreachable coordinator"
    # the router dies 0.15 s later; the coordinator's replacement rebuilds, then the router's
    run.restart_coordinator(2.0)
    assert run.coordinator is not None and sorted(run.coordinator.book.groups[0].results) == [0]
    run.restart_router(2.5)
    assert [m.request_id for m in run.logged(TrajectoryDone, "router.link")].count(1) == 1
    _assert_group_kept_once(run, run.coordinator, 0)
    assert run.router.counters["owed_finishes_sent"] == 1


def test_a_held_trajectory_whose_group_completes_later_is_delivered_before_its_group() -> None:
    run = _started()
    run.kill_coordinator()
    run.finish(0)  # counted, not completing; held
    run.restart_coordinator(2.0)
    run.restart_router(2.5)
    assert run.coordinator is not None
    assert sorted(run.coordinator.book.groups[0].results) == [0]
    run.finish(1, 3.0)  # the recalled sibling comes back finished to the replacement
    _assert_group_kept_once(run, run.coordinator, 0)


def test_a_counted_finish_whose_result_is_not_in_the_log_is_delivered_when_it_finishes_again() -> None:
    run = _started()
    run.finish(1)
    run.kill_coordinator()
    run.finish(0, logged=False)  # its instance's log record never arrived; the ledger counted it
    run.restart_coordinator(2.0)
    run.restart_router(2.5)
    assert 0 in run.router.recalled
    run.finish(0, 3.0)  # recalled, it comes back (continued) and finishes: not counted a second time
    assert run.coordinator is not None
    _assert_group_kept_once(run, run.coordinator, 0)


def test_the_coordinator_takes_each_result_and_group_verdict_once() -> None:
    flow = _coordinator()
    flow.start(0.0)
    first = flow.handle(done(0, N, num_tokens=8), 1.0)
    again = flow.handle(done(0, N, num_tokens=8), 1.0)
    assert not first and not again and len(flow.response_lengths) == 1 and flow.num_duplicates == 1
    # the group's verdict overtook its second result: it waits for it, then goes back to the router once
    assert not flow.handle(GroupFinished(prompt_id=0, request_ids=[0, 1]), 1.0)
    commands = [e.message for e in flow.handle(done(1, N, num_tokens=16), 1.0) if isinstance(e, Send)]
    assert [(type(m), m.prompt_id) for m in commands] == [(GroupAccept, 0)]
    assert not flow.handle(GroupFinished(prompt_id=0, request_ids=[0, 1]), 1.0)
    assert not flow.handle(done(1, N, num_tokens=16), 1.0) and flow.num_duplicates == 3
