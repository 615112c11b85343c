"""HostStaging: device or strided weights become reused contiguous host buffers; CPU weights pass through."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from ps_helpers import Collector, ThreadShards, assert_same

from psrl.ps import Puller, Pusher
from psrl.ps.local import LocalShards
from psrl.ps.staging import HostStaging


def test_contiguous_cpu_weights_pass_through_without_a_copy() -> None:
    weights = {"a": torch.randn(4, 8), "b": torch.randn(3)}
    staged = HostStaging().stage(weights)
    assert all(staged[name] is weights[name] for name in weights)


def test_strided_weights_are_staged_into_reused_contiguous_buffers() -> None:
    staging = HostStaging()
    first = {"w": torch.randn(8, 4).t()}
    staged = staging.stage(first)
    assert staged["w"].is_contiguous() and torch.equal(staged["w"], first["w"])
    address = staged["w"].data_ptr()
    second = {"w": torch.randn(8, 4).t()}
    restaged = staging.stage(second)
    assert restaged["w"].data_ptr() == address  # the buffer is kept from one push to the next
    assert torch.equal(restaged["w"], second["w"])
    assert staging.num_staged_bytes == 8 * 4 * 4


def test_a_changed_shape_or_dtype_gets_a_new_buffer() -> None:
    staging = HostStaging()
    staging.stage({"w": torch.randn(8, 4).t()})
    staged = staging.stage({"w": torch.randn(2, 4).t().to(torch.bfloat16)})
    assert staged["w"].shape == (4, 2) and staged["w"].dtype == torch.bfloat16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_weights_are_staged_in_pinned_host_memory() -> None:
    weights = {"w": torch.randn(64, 64, device="cuda")}
    staged = HostStaging().stage(weights)
    assert staged["w"].device.type == "cpu" and staged["w"].is_pinned()
    assert torch.equal(staged["w"], weights["w"].cpu())


def test_cast_to_the_serving_dtype_matches_the_shards_cast_and_keeps_integers() -> None:
    weights = {"w": torch.randn(16, 8), "steps": torch.arange(5)}
    staged = HostStaging(cast_to=torch.bfloat16).stage(weights)
    assert staged["w"].dtype == torch.bfloat16 and torch.equal(staged["w"], weights["w"].to(torch.bfloat16))
    assert staged["steps"] is weights["steps"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_push_hashes_each_staged_tensor_once_its_copy_landed(sockdir: str) -> None:
    weights = {f"w{i}": torch.randn(1024, 1024, device="cuda") for i in range(8)}
    staging = HostStaging(cast_to=torch.bfloat16)
    with LocalShards(sockdir, 2) as shards:
        pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=1 << 20)
        pushed = pusher.push(1, staging.stage(weights, wait=False), staging.wait_for)
        got = Collector()
        puller = Puller(shards.pull_endpoints)
        assert puller.pull(1, got).version == 1
        puller.close()
        pusher.close()
    assert pushed.num_entries > len(weights)  # split into blocks, each checked against its checksum
    assert_same(got.tensors, {name: w.to(torch.bfloat16).cpu() for name, w in weights.items()})


def test_a_push_waits_for_every_tensor_before_hashing_it(make_shards: Callable[..., ThreadShards]) -> None:
    weights = {f"w{i}": torch.randn(64, 64) for i in range(4)}
    waited: list[str] = []
    shards = make_shards()
    pusher = Pusher(shards.push_endpoints, incarnation=1)
    pusher.push(1, weights, waited.append)
    pusher.close()
    assert sorted(set(waited)) == sorted(weights)
