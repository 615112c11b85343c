"""Sparse deltas of one entry: exact round trip, dense fallback, malformed payloads refused."""

from __future__ import annotations

import pytest
import torch

from psrl.ps.delta import DeltaError, apply_sparse, encode_sparse, sparse_bytes
from psrl.ps.dtypes import byte_view


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sparse_round_trip_is_bit_exact(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(5000, generator=gen).to(dtype)
    target = base.clone()
    changed = torch.randperm(5000, generator=gen)[:40]
    target[changed] += 1.0
    target[7] = torch.nan  # NaNs compare as bytes, not values
    name = str(dtype).removeprefix("torch.")
    encoded = encode_sparse(byte_view(base), byte_view(target), name)
    assert encoded is not None
    payload, num_changed = encoded
    assert num_changed == len(set(changed.tolist()) | {7})
    assert len(payload) == sparse_bytes(num_changed, name)
    rebuilt = base.clone()
    apply_sparse(byte_view(rebuilt), payload, name, num_changed)
    as_ints = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(rebuilt.view(as_ints), target.view(as_ints))


def test_dense_changes_are_not_encoded() -> None:
    base = torch.zeros(1000)
    assert encode_sparse(byte_view(base), byte_view(base + 1), "float32") is None


def test_malformed_payloads_are_refused() -> None:
    base = torch.zeros(10)
    with pytest.raises(DeltaError):
        apply_sparse(byte_view(base), memoryview(bytearray(7)), "float32", 1)
    bad_index = torch.tensor([50], dtype=torch.int32).numpy().tobytes() + torch.ones(1).numpy().tobytes()
    with pytest.raises(DeltaError):
        apply_sparse(byte_view(base), memoryview(bytearray(bad_index)), "float32", 1)
