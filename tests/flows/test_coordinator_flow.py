"""CoordinatorFlow in process: dispatch, rewards and the group filter, hand-over, sync, migration, the end."""

from __future__ import annotations

from bus.messages import (
    ActorExited,
    BufferReady,
    Consume,
    GenerateRequest,
    GroupAccept,
    GroupDrop,
    GroupFinished,
    Metrics,
    MigrateCommand,
    Occupy,
    Refill,
    RunFinished,
    SyncCommand,
    TickRecord,
    TrainBatch,
    TrainData,
    TrainerProgress,
    WeightsLoaded,
    WeightsPublished,
)
from psrl.config import load_config
from psrl.flows.coordinator import CoordinatorFlow
from tests.flows.flow_helpers import FixedPrompts, destinations, done, published, sent, status

SMALL = ["psrl.staleness_buffer_entries=2", "psrl.rollout_n=2", "psrl.staleness=1", "actor.ppo_mini_batch_size=2"]
N = 2


def _coordinator(*overrides: str) -> CoordinatorFlow:
    prompts = FixedPrompts()
    return CoordinatorFlow(load_config("demo", [*SMALL, *overrides]), prompts, prompts)


def _complete(flow: CoordinatorFlow, prompt_id: int, lengths: tuple[int, int] = (8, 16)) -> list:
    """Both children of a group finish, then the router reports the group finished."""
    for child, length in enumerate(lengths):
        flow.handle(done(prompt_id * N + child, N, num_tokens=length), 1.0)
    return flow.handle(GroupFinished(prompt_id=prompt_id, request_ids=[prompt_id * N, prompt_id * N + 1]), 1.0)


def test_the_first_groups_go_out_within_the_dispatch_throttle() -> None:
    flow = _coordinator()
    requests = sent(flow.start(0.0), GenerateRequest, to="router")
    # (ps version 0 + 1 + min(staleness, max_dispatch_ahead)) buffers of 2 groups, N requests each
    assert [r.request_id for r in requests] == list(range(2 * 2 * N))
    assert all(r.sampling.max_tokens == 16 and r.prompt_token_ids.tolist() == [1, 2, 3] for r in requests)
    more = flow.handle(WeightsPublished(version=1, manifest_digest="", num_shards=1), 1.0)
    assert [r.prompt_id for r in sent(more, GenerateRequest)] == [4, 4, 5, 5]


def test_a_complete_group_is_scored_and_kept_or_filtered() -> None:
    flow = _coordinator("algorithm.filter_groups.enable=true")
    flow.start(0.0)
    kept = _complete(flow, 0)
    assert [c.request_ids for c in sent(kept, GroupAccept, to="router")] == [[0, 1]]
    assert [w.score for w in flow.book.groups[0].rewards.values()] == [0.5, 1.0]
    same = _complete(flow, 1, lengths=(16, 16))  # equal rewards: no learning signal
    assert [d.reason for d in sent(same, GroupDrop, to="router")] == ["filtered"]
    assert [r.prompt_id for r in sent(same, GenerateRequest)] == [4, 4]  # a replacement, outside the throttle


def test_occupied_groups_go_to_the_trainer_in_chunks_and_a_full_buffer_is_consumed() -> None:
    fgo = "psrl.fine_grain_overlap"
    flow = _coordinator(f"{fgo}.granularity=mini_batch", "actor.ppo_mini_batch_size=1")
    flow.start(0.0)
    _complete(flow, 0)
    _complete(flow, 1)
    first = flow.handle(Occupy(prompt_id=1, version=0, from_buffer=1, buffer=0, slot=0), 2.0)
    [chunk] = sent(first, TrainData, to="trainer-0")
    assert (chunk.buffer, chunk.chunk, chunk.num_chunks, chunk.prompt_ids.tolist()) == (0, 0, 2, [1, 1])
    flow.handle(Occupy(prompt_id=0, version=0, from_buffer=1, buffer=0, slot=1), 2.0)
    last = flow.handle(BufferReady(buffer=0, prompt_ids=[1, 0]), 3.0)
    [chunk] = sent(last, TrainData)
    assert chunk.chunk == 1 and chunk.rewards.tolist() == [0.5, 1.0] and chunk.v_traj.tolist() == [0, 0]
    assert sent(last, Consume, to="router") == [Consume(buffer=0, trainer_version=0)]
    [batch] = published(last, TrainBatch)
    assert batch.prompt_ids == [1, 0] and batch.num_trajectories == 4
    [metrics] = published(last, Metrics)
    assert metrics.step == 1 and metrics.values["reward/mean"] == 0.75


def test_a_publication_syncs_instances_behind_it_at_once_and_each_tick_decides_again() -> None:
    flow = _coordinator()
    flow.start(0.0)
    for name in ("rollout-0", "rollout-1"):
        flow.handle(status(name), 0.0)
    assert not published(flow.tick(0.1), SyncCommand)  # nothing newer to load
    out = flow.handle(WeightsPublished(version=1, manifest_digest="", num_shards=1), 0.15)  # no tick's wait
    [command] = published(out, SyncCommand)
    assert command.instances == ["rollout-0", "rollout-1"] and command.version == 1 and command.abort_running
    [record] = published(out, TickRecord)
    assert record.synced == ["rollout-0", "rollout-1"]
    assert not published(flow.tick(0.3), SyncCommand)  # already syncing
    flow.handle(WeightsLoaded(instance="rollout-0", version=1, load_ms=20.0), 0.35)
    assert flow.instances.states()[0].version == 1


def test_an_imbalanced_fleet_migrates_requests_to_the_starved_instance() -> None:
    mig = "psrl.rollout_coordination.sync_and_mig_strategy.mig"
    flow = _coordinator(f"{mig}.enable=true", f"{mig}.threshold=2", f"{mig}.stop_threshold=4")
    flow.start(0.0)
    flow.handle(status("rollout-0", running=8), 0.0)
    flow.handle(status("rollout-1", running=0), 0.0)
    [command] = published(flow.tick(0.1), MigrateCommand)
    assert (command.source, command.target) == ("rollout-0", "rollout-1")


def test_failed_groups_are_refilled_and_the_run_ends_after_the_last_step() -> None:
    flow = _coordinator("trainer.total_steps=2")
    flow.start(0.0)
    refill = flow.handle(Refill(num_groups=1, reason="failed", prompt_ids=[0]), 1.0)
    assert [r.prompt_id for r in sent(refill, GenerateRequest)] == [4, 4] and 0 not in flow.book.groups
    assert not published(flow.handle(TrainerProgress(step=1, version=1, num_samples=4), 2.0), RunFinished)
    [finished] = published(flow.handle(TrainerProgress(step=2, version=2, num_samples=4), 5.0), RunFinished)
    assert finished.success and finished.summary["elapsed_s"] == 5.0 and flow.is_finished
    assert flow.tick(5.1) == []


def test_it_sends_to_the_router_and_every_trainer_rank() -> None:
    flow = _coordinator("topology.n_trainer_ranks=2")
    assert set(destinations(flow.start(0.0), GenerateRequest)) == {"router"}
    _complete(flow, 0)
    _complete(flow, 1)
    flow.handle(Occupy(prompt_id=0, version=0, from_buffer=1, buffer=0, slot=0), 2.0)
    out = flow.handle(BufferReady(buffer=0, prompt_ids=[0, 1]), 2.0)
    assert destinations(out, TrainData) == ["trainer-0", "trainer-1"]


def test_a_restarted_trainer_gets_every_chunk_not_yet_trained_again() -> None:
    flow = _coordinator("topology.n_trainer_ranks=1")
    flow.start(0.0)
    for prompt_id in range(4):
        _complete(flow, prompt_id)
    flow.handle(Occupy(prompt_id=0, version=0, from_buffer=1, buffer=0, slot=0), 2.0)
    flow.handle(BufferReady(buffer=0, prompt_ids=[0, 1]), 2.0)
    flow.handle(Occupy(prompt_id=2, version=0, from_buffer=1, buffer=1, slot=0), 2.0)
    flow.handle(BufferReady(buffer=1, prompt_ids=[2, 3]), 2.0)
    flow.handle(TrainerProgress(step=1, version=1, num_samples=4), 3.0)  # buffer 0 trained
    again = flow.handle(ActorExited(actor="trainer-0", incarnation=0, returncode=-9), 4.0)
    resent = sent(again, TrainData, to="trainer-0")
    assert [d.buffer for d in resent] == [1] and resent[0].prompt_ids.tolist() == [2, 2, 3, 3]
    assert sent(flow.handle(ActorExited(actor="rollout-0", incarnation=0, returncode=-9), 4.0), TrainData) == []
