"""InstanceFlow: a real engine serving requests, streaming tokens and syncing weights, in process.

Under partial rollout an instance interrupts its requests for a sync once the version has arrived.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from bus.messages import (
    Abort,
    GenerateRequest,
    GenerateResult,
    InstanceStatus,
    MigrateCommand,
    RequestSampling,
    SyncCommand,
    TokenBatch,
    WeightsLoaded,
    WeightsPublished,
)
from psrl.config import load_config
from psrl.engine import DEMO_MODEL_DIR, Engine, EngineArgs
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.instance import InstanceFlow
from psrl.models import iter_safetensors
from psrl.ps.supply import PsWeightSupply


@dataclass
class _Pulled:
    version: int


class _GatedPuller:
    """The PS edge: a full pull that hands over the demo weights once the test opens the gate."""

    delta_sync = False

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.weights = dict(iter_safetensors(DEMO_MODEL_DIR))

    def sync(self, setter, version: int, attempts: int) -> _Pulled:  # type: ignore[no-untyped-def]
        assert self.gate.wait(30), "the test never opened the gate"
        for name, tensor in self.weights.items():
            setter(name, tensor.clone())
        return _Pulled(version)

    def close(self) -> None:
        pass


@pytest.fixture
def instance() -> Iterator[tuple[InstanceFlow, _GatedPuller, PsWeightSupply]]:
    config = load_config("demo", [])
    puller = _GatedPuller()
    supply = PsWeightSupply(puller, pull_attempts=1, prefetch=True)  # type: ignore[arg-type]
    flow = InstanceFlow("rollout-0", config, Engine(EngineArgs(num_kv_blocks=64, max_num_seqs=4)), supply)
    yield flow, puller, supply
    puller.gate.set()
    supply.close()


def _messages(effects: list[Effect], kind: type) -> list:
    return [e.message for e in effects if isinstance(e, Send | Publish) and isinstance(e.message, kind)]


def _request(request_id: int, max_tokens: int = 400) -> GenerateRequest:
    sampling = RequestSampling(max_tokens=max_tokens, ignore_eos=True, seed=request_id)
    return GenerateRequest(
        request_id=request_id,
        prompt_id=request_id // 4,
        prompt_token_ids=np.asarray([3, 4, 5], np.int32),
        sampling=sampling,
    )


def _start_requests(flow: InstanceFlow, count: int) -> list[Effect]:
    effects: list[Effect] = []
    for index in range(count):
        effects += flow.handle(_request(index), 0.0)
    for _ in range(3):
        effects += flow.step(0.0)
    return effects


def _sync(flow: InstanceFlow, version: int) -> list[Effect]:
    return flow.handle(SyncCommand(instances=[flow.name], version=version, abort_running=True, strategy="greedy"), 0.0)


def test_a_request_streams_its_tokens_and_ends_with_its_whole_response(instance) -> None:  # type: ignore[no-untyped-def]
    flow, _, _ = instance
    effects = flow.handle(_request(5, max_tokens=40), 0.0)
    while flow.has_work:
        effects += flow.step(0.0)
    chunks = _messages(effects, TokenBatch)
    [result] = _messages(effects, GenerateResult)
    assert len(result.token_ids) == 40 and result.prompt_id == 1 and result.error == ""
    assert all(c.request_ids.tolist() == [5] and c.counts.tolist() == [len(c.token_ids)] for c in chunks)
    streamed = np.concatenate([c.token_ids for c in chunks]).tolist()
    assert streamed == result.token_ids[: len(streamed)].tolist() and len(streamed) >= 32
    assert all(isinstance(e, Send) and e.to == "router" for e in effects if isinstance(e.message, TokenBatch))


def test_one_step_streams_the_tokens_of_all_its_requests_in_one_message(instance) -> None:  # type: ignore[no-untyped-def]
    flow, _, _ = instance
    effects: list[Effect] = []
    for index in range(4):
        effects += flow.handle(_request(index, max_tokens=200), 0.0)
    while not _messages(effects, TokenBatch):
        effects += flow.step(0.0)
    [batch] = _messages(effects, TokenBatch)
    assert sorted(batch.request_ids.tolist()) == [0, 1, 2, 3]
    assert batch.counts.sum() == len(batch.token_ids) == len(batch.logprobs) == len(batch.versions)
    assert all(count >= 16 for count in batch.counts.tolist())


def test_the_first_status_tells_the_router_the_instance_exists(instance) -> None:  # type: ignore[no-untyped-def]
    flow, _, _ = instance
    [effect] = flow.start(0.0)  # its link publishes it too (for the coordinator)
    assert isinstance(effect, Send) and effect.to == "router" and effect.model_version == 0
    assert isinstance(effect.message, InstanceStatus) and effect.message.instance == "rollout-0"


def test_a_replacement_loads_the_committed_version_before_it_reports_itself(instance) -> None:  # type: ignore[no-untyped-def]
    flow, puller, _ = instance
    puller.gate.set()
    effects = flow.start(0.0, committed_version=3)
    [loaded] = _messages(effects, WeightsLoaded)
    statuses = _messages(effects, InstanceStatus)
    assert loaded.version == 3 and flow.engine.weight_version == 3
    assert statuses and all(s.weight_version == 3 for s in statuses)  # the router never sees it at version 0


def test_abort_and_migration_hand_requests_back_with_their_tokens(instance) -> None:  # type: ignore[no-untyped-def]
    flow, _, _ = instance
    _start_requests(flow, 3)
    aborted = _messages(flow.handle(Abort(request_ids=[0], reason="surplus"), 0.0), GenerateResult)
    assert [(r.request_id, r.error) for r in aborted] == [(0, "surplus")] and len(aborted[0].token_ids) > 0
    command = MigrateCommand(source="rollout-0", target="rollout-1", request_ids=[], num_requests=1)
    migrated = _messages(flow.handle(command, 0.0), GenerateResult)
    assert [(r.request_id, r.error) for r in migrated] == [(2, "migrate")]  # the newest one


def test_generation_goes_on_until_the_background_pull_lands(instance) -> None:  # type: ignore[no-untyped-def]
    flow, puller, supply = instance
    _start_requests(flow, 2)
    flow.handle(WeightsPublished(version=1, manifest_digest="", num_shards=1), 0.0)  # starts the background pull
    sent = _sync(flow, 1)
    before = flow.engine.status().num_generated_tokens_total
    for _ in range(5):
        sent += flow.step(0.0)  # still generating on version 0
    assert flow.engine.status().num_generated_tokens_total > before
    assert not _messages(sent, GenerateResult)
    puller.gate.set()
    while supply.prefetcher is not None and supply.prefetcher.is_running:
        threading.Event().wait(0.01)
    sent += flow.step(0.0)
    interrupted = _messages(sent, GenerateResult)
    assert len(interrupted) == 2 and all(m.error == "sync" and len(m.token_ids) >= 8 for m in interrupted)
    assert all((m.versions == 0).all() for m in interrupted)
    [loaded] = _messages(sent, WeightsLoaded)
    assert loaded.version == 1 and loaded.prefetched and flow.engine.weight_version == 1


def test_without_a_pull_in_flight_the_sync_interrupts_at_once(instance) -> None:  # type: ignore[no-untyped-def]
    flow, puller, _ = instance
    _start_requests(flow, 2)
    interrupted = _messages(_sync(flow, 1), GenerateResult)
    assert len(interrupted) == 2 and all(m.error == "sync" for m in interrupted)
    puller.gate.set()
    assert _messages(flow.step(0.0), WeightsLoaded)  # pulls and loads
    assert flow.engine.weight_version == 1
    assert torch.equal(flow.engine.runner.model.norm.detach(), puller.weights["model.norm.weight"])


def test_a_bad_request_fails_alone(instance) -> None:  # type: ignore[no-untyped-def]
    flow, _, _ = instance
    bad = GenerateRequest(
        request_id=9, prompt_id=2, prompt_token_ids=np.asarray([], np.int32), sampling=RequestSampling(max_tokens=4)
    )
    [result] = _messages(flow.handle(bad, 0.0), GenerateResult)
    assert result.request_id == 9 and int(result.finish_reason) == 3 and result.error
    assert not flow.has_work
