"""RouterFlow in process: routing, the ledger, partial and redundant rollout, sync, migration, lost instances."""

from __future__ import annotations

import msgspec
import numpy as np

from bus.messages import (
    Abort,
    ActorExited,
    BufferReady,
    Consume,
    FinishReason,
    GenerateRequest,
    GroupAccept,
    GroupDrop,
    GroupFinished,
    LedgerOp,
    Metrics,
    Occupy,
    Reserve,
    RouterStatus,
    RoutingRecord,
    SyncCommand,
    TokenBatch,
    TrajectoryDone,
    WeightsLoaded,
)
from psrl.config import load_config
from psrl.flows.effects import Effect, Send
from psrl.flows.router import RouterFlow
from psrl.routing.decision import RoutingDecision
from tests.flows.flow_helpers import destinations, published, request, result, sent, status

SMALL = ["psrl.staleness_buffer_entries=2", "psrl.rollout_n=2", "psrl.staleness=1", "actor.ppo_mini_batch_size=2"]
N = 2


def _router(*overrides: str) -> RouterFlow:
    flow = RouterFlow(load_config("demo", [*SMALL, *overrides]))
    flow.start(0.0)
    for name in ("rollout-0", "rollout-1"):
        flow.handle(status(name), 0.0)
    return flow


def _submit(flow: RouterFlow, prompt_id: int, n: int = N) -> list[Effect]:
    effects: list[Effect] = []
    for child in range(n):
        effects += flow.handle(request(prompt_id * n + child, n), 0.0)
    return effects + flow.route(0.0)


def _finish(
    flow: RouterFlow, routed: list[GenerateRequest], effects: list[Effect], num_tokens: int = 8
) -> list[Effect]:
    """Every routed request finishes on the instance it went to."""
    where = dict(zip([r.request_id for r in routed], destinations(effects, GenerateRequest), strict=True))
    out: list[Effect] = []
    for req in routed:
        out += flow.handle(result(req, where[req.request_id], num_tokens=num_tokens), 1.0)
    return out


def test_requests_are_spread_over_instances_and_reserve_their_slots() -> None:
    flow = _router()
    effects = _submit(flow, 0) + _submit(flow, 1)
    routed = sent(effects, GenerateRequest)
    assert sorted(r.request_id for r in routed) == [0, 1, 2, 3]
    assert sorted(destinations(effects, GenerateRequest)) == ["rollout-0", "rollout-0", "rollout-1", "rollout-1"]
    assert all(r.pinned_version == 0 and r.generated_token_ids is None for r in routed)
    assert {(r.prompt_id, r.buffer) for r in published(effects, Reserve)} == {(0, 1), (1, 1)}  # latest legal buffer
    records = published(effects, RoutingRecord)
    assert [msgspec.msgpack.decode(r.record, type=RoutingDecision).inputs is not None for r in records] == [True] * 4


def test_nothing_is_routed_before_every_instance_has_joined() -> None:
    flow = RouterFlow(load_config("demo", SMALL))
    flow.handle(status("rollout-0"), 0.0)
    flow.handle(request(0, N), 0.0)
    assert flow.route(1.0) == []
    assert sent(flow.route(11.0), GenerateRequest)  # after the grace period the one that joined serves


def test_a_finished_group_completes_occupies_and_fills_a_buffer_that_is_then_consumed() -> None:
    flow = _router()
    effects = _submit(flow, 0) + _submit(flow, 1)
    out = _finish(flow, sent(effects, GenerateRequest), effects)
    done = sent(out, TrajectoryDone, to="coordinator")
    assert sorted(d.request_id for d in done) == [0, 1, 2, 3] and all(len(d.token_ids) == 8 for d in done)
    assert [c.prompt_id for c in sent(out, GroupFinished, to="coordinator")] == [0, 1]
    out = flow.handle(GroupAccept(prompt_id=0, request_ids=[0, 1]), 2.0)
    out += flow.handle(GroupAccept(prompt_id=1, request_ids=[2, 3]), 2.0)
    assert [(o.prompt_id, o.buffer, o.slot) for o in sent(out, Occupy)] == [(0, 0, 0), (1, 0, 1)]
    [ready] = sent(out, BufferReady)
    assert ready.buffer == 0 and ready.prompt_ids == [0, 1]
    out = flow.handle(Consume(buffer=0, trainer_version=0), 3.0)
    [metrics] = published(out, Metrics)
    assert metrics.values == {"staleness/count_0": 4.0, "staleness/bound_violations": 0.0}
    ops = [op.op for op in published(out, LedgerOp)]
    assert ops == ["consume"] and flow.ledger.next_buffer_id == 1


def test_an_interrupted_trajectory_continues_from_its_tokens_at_its_version() -> None:
    flow = _router()
    effects = _submit(flow, 0)
    first = sent(effects, GenerateRequest)[0]
    where = destinations(effects, GenerateRequest)[0]
    flow.handle(
        TokenBatch(
            request_ids=np.asarray([0], np.int64),
            counts=np.asarray([4], np.int32),
            token_ids=np.arange(4, dtype=np.int32) + 10,
            logprobs=np.zeros(4, np.float32),
            versions=np.zeros(4, np.int32),
            instance=where,
        ),
        0.5,
    )
    out = flow.handle(result(first, where, num_tokens=5, error="sync"), 1.0)
    assert not sent(out, TrajectoryDone)  # looped back, not ended
    flow.handle(WeightsLoaded(instance="rollout-0", version=1), 1.0)
    flow.handle(WeightsLoaded(instance="rollout-1", version=1), 1.0)
    [again] = sent(flow.route(1.5), GenerateRequest)
    assert again.request_id == 0 and again.pinned_version == 0  # V_traj stays
    assert again.generated_token_ids.tolist() == list(range(10, 15)) and again.generated_versions.tolist() == [0] * 5
    assert flow.tracker.num_loopbacks == 1


def test_a_token_batch_extends_each_of_its_requests_and_a_malformed_one_is_counted() -> None:
    flow = _router()
    for index in range(2):
        _submit(flow, index)
    live = sorted(flow.tracker.live)[:2]
    batch = TokenBatch(
        request_ids=np.array(live, np.int64),
        counts=np.array([3, 2], np.int32),
        token_ids=np.array([1, 2, 3, 7, 8], np.int32),
        logprobs=np.zeros(5, np.float32),
        versions=np.zeros(5, np.int32),
        instance="rollout-0",
    )
    flow.handle(batch, 0.5)
    assert flow.tracker.live[live[0]].token_ids.tolist() == [1, 2, 3]
    assert flow.tracker.live[live[1]].token_ids.tolist() == [7, 8]
    broken = TokenBatch(
        request_ids=batch.request_ids,
        counts=np.array([3, 9], np.int32),
        token_ids=batch.token_ids,
        logprobs=batch.logprobs,
        versions=batch.versions,
        instance="rollout-0",
    )
    flow.handle(broken, 0.6)
    assert flow.counters["malformed_token_batches"] == 1
    assert flow.tracker.live[live[1]].token_ids.tolist() == [7, 8]


def test_without_partial_rollout_an_interrupted_trajectory_starts_over() -> None:
    flow = _router("psrl.rollout_coordination.partial_rollout.enable=false")
    effects = _submit(flow, 0)
    first = sent(effects, GenerateRequest)[0]
    flow.handle(result(first, destinations(effects, GenerateRequest)[0], num_tokens=5, error="sync"), 1.0)
    [again] = sent(flow.route(1.5), GenerateRequest)
    assert again.request_id == 0 and again.generated_token_ids is None
    assert flow.tracker.num_wasted_tokens == 5


def test_redundant_children_beyond_n_are_aborted_where_they_run() -> None:
    red = "psrl.rollout_coordination.redundant_rollout."
    flow = _router(f"{red}enable=true", f"{red}redundant_rollout_n=3")
    effects = _submit(flow, 0, n=3)
    routed = sent(effects, GenerateRequest)
    where = dict(zip([r.request_id for r in routed], destinations(effects, GenerateRequest), strict=True))
    out = flow.handle(result(routed[0], where[0], num_tokens=8), 1.0)
    out += flow.handle(result(routed[1], where[1], num_tokens=8), 1.0)
    [finished] = sent(out, GroupFinished)
    assert finished.request_ids == [0, 1]
    [abort] = sent(out, Abort, to=where[2])
    assert abort.request_ids == [2] and abort.reason == "surplus"
    late = flow.handle(result(routed[2], where[2], num_tokens=3, error="surplus"), 1.5)
    [given_up] = sent(late, TrajectoryDone)
    assert given_up.request_id == 2 and int(given_up.finish_reason) == 2 and given_up.error == "surplus"


def test_routing_holds_while_a_sync_loads() -> None:
    flow = _router()
    flow.handle(SyncCommand(instances=["rollout-0"], version=1), 0.0)
    assert flow.core.is_paused and flow.syncing == {"rollout-0"}
    assert not sent(_submit(flow, 0), GenerateRequest)
    flow.handle(WeightsLoaded(instance="rollout-0", version=1), 1.0)
    assert not flow.core.is_paused and not flow.syncing
    assert len(sent(flow.route(1.0), GenerateRequest)) == N


def test_a_migrated_request_is_placed_again_with_its_tokens() -> None:
    flow = _router("psrl.rollout_coordination.routing_strategy.method=round_robin")
    effects = _submit(flow, 0)
    routed = sent(effects, GenerateRequest)
    source = destinations(effects, GenerateRequest)[0]
    flow.handle(result(routed[0], source, num_tokens=6, error="migrate"), 1.0)
    out = flow.route(1.0)
    [moved] = sent(out, GenerateRequest)
    assert moved.request_id == routed[0].request_id and moved.generated_token_ids.tolist() == list(range(10, 16))
    assert moved.pinned_version == 0 and flow.tracker.num_loopbacks == 1
    assert destinations(out, GenerateRequest) == ["rollout-0"]  # round robin: the next in turn


def test_requests_of_a_lost_instance_are_routed_again() -> None:
    flow = _router()
    effects = _submit(flow, 0) + _submit(flow, 1)
    lost = [
        r.request_id
        for r, to in zip(sent(effects, GenerateRequest), destinations(effects, GenerateRequest), strict=True)
        if to == "rollout-0"
    ]
    flow.handle(ActorExited(actor="rollout-0", incarnation=0, returncode=-9), 20.0)
    out = flow.route(20.0)  # one of two instances left: routing goes on once the join grace is over
    assert sorted(r.request_id for r in sent(out, GenerateRequest)) == sorted(lost)
    assert set(destinations(out, GenerateRequest)) == {"rollout-1"}


def test_a_request_the_link_cannot_deliver_is_routed_again() -> None:
    flow = _router()
    effects = _submit(flow, 0)
    undelivered = next(e for e in effects if isinstance(e, Send) and isinstance(e.message, GenerateRequest))
    assert flow.undeliverable(undelivered, 0.1) == []
    assert [r.request_id for r in sent(flow.route(0.2), GenerateRequest)] == [undelivered.message.request_id]


def test_status_reports_the_queue_to_the_coordinator() -> None:
    flow = _router()
    flow.handle(request(0, N), 0.0)
    out = flow.status(0.0)
    [report] = sent(out, RouterStatus, to="coordinator")
    assert report.num_queued == 1 and report.versions == [0] and len(out) == 1  # its link logs it


def test_proactive_truncate_completes_the_buffer_the_trainer_waits_for() -> None:
    pf = "psrl.rollout_coordination.proactive_filter_strategy"
    flow = _router(f"{pf}.method=truncate", f"{pf}.threshold=1", "psrl.staleness=0")
    effects = _submit(flow, 0) + _submit(flow, 1)
    routed = sent(effects, GenerateRequest)
    where = dict(zip([r.request_id for r in routed], destinations(effects, GenerateRequest), strict=True))
    out: list[Effect] = []
    for req in routed[:2]:  # group 0 finishes and occupies; group 1 straggles
        out += flow.handle(result(req, where[req.request_id], num_tokens=8), 1.0)
    out += flow.handle(GroupAccept(prompt_id=0, request_ids=[0, 1]), 1.0)
    acted = [op.outcome.split()[0] for op in published(out, LedgerOp) if op.op == "proactive" and op.outcome != "none"]
    assert acted == ["truncate"]
    assert sorted(a.request_ids[0] for a in sent(out, Abort)) == [2, 3]  # stopped; their output is kept
    assert not sent(out, BufferReady)  # not before the truncated outputs are in
    for req in routed[2:]:
        out += flow.handle(result(req, where[req.request_id], num_tokens=3, error="truncate"), 1.5)
    truncated = [d for d in sent(out, TrajectoryDone) if d.request_id in (2, 3)]
    assert [len(d.token_ids) for d in truncated] == [3, 3]
    assert all(d.finish_reason == FinishReason.TRUNCATED for d in truncated)
    [finished] = [c for c in sent(out, GroupFinished) if c.prompt_id == 1]
    assert finished.occupied_buffer == 0  # already occupied: the coordinator does not ask again
    assert [sorted(r.prompt_ids) for r in sent(out, BufferReady)] == [[0, 1]]


def test_a_copy_of_a_request_is_dropped_whether_it_is_queued_running_or_finished() -> None:
    """A restarted coordinator sends again what may have died in its predecessor's socket: the router
    takes each request id once in a launch."""
    flow = _router()
    effects = _submit(flow, 0)
    routed = sent(effects, GenerateRequest)
    assert sent(flow.handle(request(0, N), 0.5) + flow.route(0.5), GenerateRequest) == []  # running
    _finish(flow, routed, effects)
    assert 0 not in flow.tracker.live
    assert sent(flow.handle(request(0, N), 1.5) + flow.route(1.5), GenerateRequest) == []  # finished
    assert flow.counters["duplicate_requests"] == 2
    assert sent(_submit(flow, 1), GenerateRequest)  # new ids are taken as before


def test_a_copy_of_a_group_verdict_or_consume_is_dropped() -> None:
    """An accept taken twice would be refused by the ledger and answered with a drop of a kept group."""
    flow = _router()
    effects = _submit(flow, 0) + _submit(flow, 1)
    _finish(flow, sent(effects, GenerateRequest), effects)
    for prompt_id in (0, 1):
        flow.handle(GroupAccept(prompt_id=prompt_id, request_ids=[prompt_id * N, prompt_id * N + 1]), 2.0)
    copy = flow.handle(GroupAccept(prompt_id=0, request_ids=[0, 1]), 2.1)
    assert sent(copy, GroupDrop) == [] and sent(copy, Occupy) == []
    flow.handle(Consume(buffer=0, trainer_version=0), 3.0)
    assert flow.handle(Consume(buffer=0, trainer_version=0), 3.1) == []
    assert flow.ledger.next_buffer_id == 1 and flow.counters["duplicate_commands"] == 2
