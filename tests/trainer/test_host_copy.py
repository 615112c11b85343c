"""Copies to the host through pinned slots: every byte, whatever the size, dtype or layout."""

from __future__ import annotations

import pytest
import torch

from psrl.trainer.host_copy import PinnedStager, chunk_spans


def test_spans_cover_every_byte_once_in_slot_sized_pieces() -> None:
    for nbytes in (0, 1, 63, 64, 65, 1000):
        spans = chunk_spans(nbytes, 64)
        assert [b for start, end in spans for b in range(start, end)] == list(range(nbytes))
        assert all(0 < end - start <= 64 for start, end in spans)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_arrive_bit_exact_in_slots_smaller_than_them() -> None:
    device = torch.device("cuda")
    stager = PinnedStager(device, slot_bytes=1000)  # odd on purpose: chunks split elements
    stager.stream.wait_stream(torch.cuda.current_stream())
    tensors = [
        torch.randn(3001, device=device, dtype=torch.bfloat16),
        torch.randn(17, 129, device=device),
        torch.randint(-(2**40), 2**40, (777,), device=device),
        torch.randn(40, 60, device=device).t(),  # not contiguous
        torch.tensor(3.5, device=device),  # 0-dim
        torch.empty(0, 5, device=device),
        torch.rand(513, device=device) > 0.5,
    ]
    for tensor in tensors:
        copy = stager.to_host(tensor)
        assert copy.device.type == "cpu" and copy.dtype == tensor.dtype and copy.shape == tensor.shape
        assert torch.equal(copy, tensor.cpu())
    host = torch.arange(4)
    assert stager.to_host(host) is host  # already there
