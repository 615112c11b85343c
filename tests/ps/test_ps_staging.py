"""HostStaging: device or strided weights become reused contiguous host buffers; CPU weights pass through."""

from __future__ import annotations

import pytest
import torch

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
