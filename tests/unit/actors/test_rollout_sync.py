"""Under partial rollout a rollout instance interrupts its requests for a sync once the version has arrived."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from actors.rollout import RolloutActor, _Stream
from bus.messages import GenerateResult, SyncCommand, WeightsLoaded
from psrl.config import load_config
from psrl.engine import DEMO_MODEL_DIR, Engine, EngineArgs, SamplingParams
from psrl.log import get_logger
from psrl.models import iter_safetensors
from psrl.ps.prefetch import Prefetcher


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


@pytest.fixture
def instance() -> Iterator[tuple[RolloutActor, _GatedPuller, list]]:
    actor = object.__new__(RolloutActor)
    actor.name, actor.log = "rollout-0", get_logger("test")
    actor.config = load_config("demo", [])
    actor.routing = actor.config.psrl.rollout_coordination.routing_strategy
    actor.engine = Engine(EngineArgs(num_kv_blocks=64, max_num_seqs=4))
    actor._handlers = actor._handler_table()
    actor.num_unhandled = actor.num_handler_errors = 0
    puller = _GatedPuller()
    actor.puller, actor.prefetcher = puller, Prefetcher(puller)  # type: ignore[arg-type]
    actor.streams, actor.prompt_ids, actor.pending_sync = {}, {}, None
    sent: list = []
    actor.link = SimpleNamespace(send=lambda message, **_: sent.append(message))
    actor.publisher = SimpleNamespace(publish=lambda message, **_: sent.append(message))
    actor._report_status = lambda: None  # type: ignore[method-assign]
    yield actor, puller, sent
    puller.gate.set()
    actor.prefetcher.close()


def _start_requests(actor: RolloutActor, count: int) -> None:
    for index in range(count):
        actor.engine.add_request(str(index), [3, 4, 5], SamplingParams(max_tokens=400, ignore_eos=True))
        actor.streams[str(index)] = _Stream()
    for _ in range(3):
        actor.step()


def _sync(actor: RolloutActor, version: int) -> None:
    command = SyncCommand([actor.name], version, True, "greedy")
    actor.dispatch(SimpleNamespace(envelope=SimpleNamespace(kind=SyncCommand.KIND, sender="c"), message=command))


def test_generation_goes_on_until_the_background_pull_lands(instance) -> None:  # type: ignore[no-untyped-def]
    actor, puller, sent = instance
    _start_requests(actor, 2)
    assert actor.prefetcher.start(1)
    _sync(actor, 1)
    before = actor.engine.status().num_generated_tokens_total
    for _ in range(5):
        assert actor.step()  # still generating on version 0
    assert actor.engine.status().num_generated_tokens_total > before
    assert not [m for m in sent if isinstance(m, GenerateResult)]
    puller.gate.set()
    while actor.prefetcher.is_running:
        threading.Event().wait(0.01)
    actor.step()
    interrupted = [m for m in sent if isinstance(m, GenerateResult)]
    assert len(interrupted) == 2 and all(m.error == "sync" and len(m.token_ids) >= 8 for m in interrupted)
    assert all((m.versions == 0).all() for m in interrupted)
    [loaded] = [m for m in sent if isinstance(m, WeightsLoaded)]
    assert loaded.version == 1 and loaded.prefetched and actor.engine.weight_version == 1


def test_without_a_pull_in_flight_the_sync_interrupts_at_once(instance) -> None:  # type: ignore[no-untyped-def]
    actor, puller, sent = instance
    _start_requests(actor, 2)
    _sync(actor, 1)
    interrupted = [m for m in sent if isinstance(m, GenerateResult)]
    assert len(interrupted) == 2 and all(m.error == "sync" for m in interrupted)
    puller.gate.set()
    assert actor.step()  # pulls and loads
    assert actor.engine.weight_version == 1
    assert torch.equal(actor.engine.runner.model.norm.detach(), puller.weights["model.norm.weight"])
