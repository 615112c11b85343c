"""A coordinator restarted mid-run: its flow re-run on the logged inputs reaches its predecessor's state,
and only what the predecessor had not done yet is done."""

from __future__ import annotations

from bus.messages import (
    BufferReady,
    Consume,
    GenerateRequest,
    GroupAccept,
    GroupDrop,
    GroupFinished,
    LedgerOp,
    Metrics,
    Occupy,
    RoutingRecord,
    TrainData,
    TrainerProgress,
    WeightsPublished,
)
from bus.schema import Message
from psrl.config import load_config
from psrl.flows.coordinator import CoordinatorFlow
from psrl.flows.coordinator_recovery import replay_coordinator
from psrl.flows.effects import Effect, Publish, Send
from tests.flows.flow_helpers import FixedPrompts, LoggedEvents, done, sent

COMMANDS = (GroupAccept, GroupDrop, Consume)
SMALL = ["psrl.staleness_buffer_entries=2", "psrl.rollout_n=2", "psrl.staleness=1", "actor.ppo_mini_batch_size=2"]
N = 2


class Log(LoggedEvents):
    def __init__(self) -> None:
        super().__init__()
        # die in the coordinator's socket: logged by its link, never delivered
        self.lose_requests: set[int] = set()
        self.lose_commands: set[type] = set()

    def coordinator(self, effects: list[Effect]) -> list[Effect]:
        """What the coordinator did, as its links and publisher log it (chunks are not logged), and the
        router taking what reached it: a request's RoutingRecord, a command's ledger record."""
        for effect in effects:
            if isinstance(effect, Send) and effect.message.LOGGED:
                sent_event = self.add(f"coordinator-{effect.to}.link", effect.message)
                message = effect.message
                if isinstance(message, GenerateRequest) and message.request_id not in self.lose_requests:
                    self.add("router", RoutingRecord(message.request_id, "rollout-0", "balance", b""))
                elif isinstance(message, COMMANDS) and type(message) not in self.lose_commands:
                    self.add("router", LedgerOp("op", 0, -1, "", ""), parent=sent_event.envelope.event_id)
            elif isinstance(effect, Publish):
                self.add("coordinator", effect.message)
        return effects


def _flow() -> CoordinatorFlow:
    prompts = FixedPrompts()
    return CoordinatorFlow(load_config("demo", SMALL), prompts, prompts)


def _tell(log: Log, flow: CoordinatorFlow, message: Message, sender: str = "router.link") -> list[Effect]:
    log.add(sender, message)
    return log.coordinator(flow.handle(message, 1.0))


def _first_life(log: Log, *, occupy_second: bool) -> CoordinatorFlow:
    """Groups 0 and 1 complete and occupy buffer 0 (its first chunk goes out), version 1 is published."""
    flow = _flow()
    log.coordinator(flow.start(0.0))
    for prompt_id in (0, 1):
        for child, length in enumerate((8, 16)):
            _tell(log, flow, done(prompt_id * N + child, N, num_tokens=length))
        _tell(log, flow, GroupFinished(prompt_id=prompt_id, request_ids=[prompt_id * N, prompt_id * N + 1]))
    _tell(log, flow, Occupy(prompt_id=0, version=0, from_buffer=1, buffer=0, slot=0))
    if occupy_second:
        _tell(log, flow, Occupy(prompt_id=1, version=0, from_buffer=1, buffer=0, slot=1))
    _tell(log, flow, WeightsPublished(version=1, manifest_digest="", num_shards=1), sender="ps-0")
    return flow


def test_the_rerun_reaches_the_dead_coordinators_state_and_repeats_nothing_it_did() -> None:
    log = Log()
    dead = _first_life(log, occupy_second=True)
    flow = _flow()
    recovery = replay_coordinator(flow, log.events, launch=0, now=5.0)
    assert flow.book.next_prompt_id == dead.book.next_prompt_id
    assert sorted(flow.book.groups) == sorted(dead.book.groups)
    assert flow.emitter.current == dead.emitter.current
    effects = recovery.effects
    assert not sent(effects, GenerateRequest) and not sent(effects, GroupAccept) and not sent(effects, Consume)
    assert not [e for e in effects if isinstance(e, Publish) and isinstance(e.message, Metrics)]
    # chunks the trainer has not reported trained are handed over again (the rank skips duplicates)
    resent = sent(effects, TrainData, to="trainer-0")
    assert len(resent) == sum(len(chunks) for chunks in dead.unacknowledged.values())


def test_what_the_dead_coordinator_never_got_to_do_is_done_now() -> None:
    log = Log()
    dead = _first_life(log, occupy_second=True)
    # the router's last message reached the log, but the coordinator died before handling it
    log.add("router.link", BufferReady(buffer=0, prompt_ids=[0, 1]))
    flow = _flow()
    recovery = replay_coordinator(flow, log.events, launch=0, now=5.0)
    assert [c.buffer for c in sent(recovery.effects, Consume, to="router")] == [0]
    assert [d.buffer for d in sent(recovery.effects, TrainData, to="trainer-0")] == [0] * recovery.num_resent_chunks
    assert recovery.num_resent_chunks > 0
    assert dead.emitter.current == 0 and flow.emitter.current == 1
    assert recovery.seen_event_ids >= {e.envelope.event_id for e in log.events if e.envelope.sender == "router.link"}


def test_buffers_the_trainer_reported_are_not_handed_over_again_and_other_launches_do_not_count() -> None:
    log = Log()
    _first_life(log, occupy_second=True)
    log.add("router.link", BufferReady(buffer=0, prompt_ids=[0, 1]))
    log.add("trainer-0", TrainerProgress(step=1, version=1, num_samples=4))
    log.add("router.link", Occupy(prompt_id=7, version=0, from_buffer=1, buffer=0, slot=1), incarnation=1000)
    flow = _flow()
    recovery = replay_coordinator(flow, log.events, launch=0, now=5.0)
    assert not sent(recovery.effects, TrainData) and recovery.num_resent_chunks == 0
    assert 7 not in flow.book.groups


def test_a_log_that_lost_events_says_so() -> None:
    log = Log()
    _first_life(log, occupy_second=True)
    assert replay_coordinator(_flow(), log.events, launch=0, now=5.0).num_missing_events == 0
    del log.events[[i for i, e in enumerate(log.events) if e.envelope.sender == "router.link"][1]]
    assert replay_coordinator(_flow(), log.events, launch=0, now=5.0).num_missing_events == 1


def test_a_request_the_router_never_got_is_sent_again() -> None:
    """The dead coordinator's link logged the request, but it died in the socket's queue with the
    process: no event of the router names it, so the replacement sends it again."""
    log = Log()
    log.lose_requests = {N * 2}  # the first request of prompt 2, sent after groups 0 and 1 completed
    _first_life(log, occupy_second=True)
    assert any(isinstance(e.message, GenerateRequest) and e.message.request_id == N * 2 for e in log.events)
    recovery = replay_coordinator(_flow(), log.events, launch=0, now=5.0)
    assert [r.request_id for r in sent(recovery.effects, GenerateRequest)] == [N * 2]


def test_a_command_the_router_never_handled_is_sent_again() -> None:
    """The group verdict was logged by the dead coordinator's link, but no router record was logged
    while handling it: it died in the socket (or waits in the router's queue: the router drops a copy)."""
    log = Log()
    log.lose_commands = {GroupAccept}
    _first_life(log, occupy_second=True)
    logged = [e.message.prompt_id for e in log.events if isinstance(e.message, GroupAccept)]
    assert logged == [0, 1]
    recovery = replay_coordinator(_flow(), log.events, launch=0, now=5.0)
    assert sorted(a.prompt_id for a in sent(recovery.effects, GroupAccept)) == [0, 1]
    assert sent(recovery.effects, Consume) == []  # none was due yet; the handled ones are not repeated
