"""A version pushed from a snapshot of the weights (``trainer.background_push``): the push runs on another thread
while the trainer changes its weights, and the shards serve exactly the weights of the moment the snapshot was
taken, on every transport path (device copies into shared memory, host staging for the others)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
from ps_helpers import Collector, ThreadShards, assert_same, small_model

from psrl.ps import Puller, Pusher
from psrl.ps.staging import HostStaging, WeightSnapshot, pushed_num_bytes

MakeShards = Callable[..., ThreadShards]
BLOCK = 16 << 10
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
]


def _as_pushed(model: dict[str, torch.Tensor], cast_to: torch.dtype | None) -> dict[str, torch.Tensor]:
    casts = cast_to is not None
    return {n: (t.to(cast_to) if casts and t.is_floating_point() else t).clone() for n, t in model.items()}


def _push_in_thread(pusher: Pusher, version: int, snapshot: WeightSnapshot, taken: dict[str, torch.Tensor],
                    staging: HostStaging) -> tuple[threading.Thread, list[object]]:  # fmt: skip
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(pusher.push_weights(version, taken, staging, after=snapshot.ready))
        except Exception as exc:  # handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transport", ["shm", "zmq"])
def test_the_shards_serve_the_weights_of_the_snapshot_while_training_changes_them(
    make_shards: MakeShards, device: str, transport: str
) -> None:
    cast_to = torch.bfloat16
    weights = {name: t.to(device) for name, t in small_model(1).items()}
    shards = make_shards(2, transport)
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport=transport, max_block_bytes=BLOCK)
    puller = Puller(shards.pull_endpoints, transport=transport, timeout_s=10)
    snapshot, staging = WeightSnapshot(cast_to), HostStaging(cast_to)
    try:
        for version in (1, 2):
            if device == "cuda":  # the snapshot's copy queued behind a long kernel: the push must wait for it
                torch.cuda._sleep(50_000_000)
            taken = snapshot.take(weights)
            thread, outcome = _push_in_thread(pusher, version, snapshot, taken, staging)
            expected = _as_pushed({n: t.cpu() for n, t in weights.items()}, cast_to)  # queued after the snapshot
            for tensor in weights.values():  # the next step changes every weight in place
                tensor.add_(1)
            thread.join(60)
            assert not thread.is_alive() and not isinstance(outcome[0], Exception), outcome
            got = Collector()
            assert puller.pull(version, got).version == version
            assert_same(got.tensors, expected)
        assert pushed_num_bytes(weights, cast_to) == sum(t.numel() * t.element_size() for t in taken.values())
    finally:
        pusher.close()
        puller.close()


def test_a_snapshot_reuses_its_buffers_and_follows_a_new_layout() -> None:
    snapshot = WeightSnapshot(torch.bfloat16)
    first = snapshot.take(small_model(1))
    second = snapshot.take(small_model(2))
    assert all(first[n].data_ptr() == second[n].data_ptr() for n in first)
    assert second["steps"].dtype == torch.int64 and second["embed.weight"].dtype == torch.bfloat16
    grown = {**small_model(3), "embed.weight": torch.zeros(301, 64)}
    third = snapshot.take(grown)
    assert third["embed.weight"].shape == (301, 64)
    assert third["embed.weight"].data_ptr() != first["embed.weight"].data_ptr()
    assert snapshot.ready is None  # on the CPU the copies are done when take returns
