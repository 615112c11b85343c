"""Sparse deltas of one entry between two versions: the indices and new values of changed elements.

In RL fine-tuning served in bf16, only a few percent of the elements change from one step to the
next (a small update moves most values by less than one bf16 step), so a puller that holds version
``b`` fetches ``b -> v`` as (int32 indices, new values) for each entry where that is smaller than the
entry itself. Elements are compared as integers of the same width, so the reconstruction is exact
bit for bit, and the puller checks it against the entry's checksum like any other entry.
"""

from __future__ import annotations

import numpy as np

from psrl.ps.dtypes import itemsize_of

DENSE = 0
SPARSE = 1
# A sparse entry is sent only when it is at most this fraction of the dense bytes.
MAX_SPARSE_FRACTION = 0.5
_INT_OF_SIZE = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


class DeltaError(ValueError):
    """A sparse payload that does not fit the entry it claims to update."""


def sparse_bytes(num_changed: int, dtype: str) -> int:
    return num_changed * (4 + itemsize_of(dtype))


def encode_sparse(base: memoryview, target: memoryview, dtype: str) -> tuple[memoryview, int] | None:
    """(payload, number of changed elements), or None when sending the entry whole is as cheap."""
    if len(base) != len(target) or not len(target):
        return None
    ints = _INT_OF_SIZE[itemsize_of(dtype)]
    old = np.frombuffer(base, dtype=ints)
    new = np.frombuffer(target, dtype=ints)
    if old.size >= 2**31:
        return None
    changed = np.flatnonzero(old != new)
    num_changed = int(changed.size)
    if sparse_bytes(num_changed, dtype) > MAX_SPARSE_FRACTION * len(target):
        return None
    payload = np.empty(sparse_bytes(num_changed, dtype), dtype=np.uint8)
    split = 4 * num_changed
    payload[:split].view(np.int32)[:] = changed
    payload[split:].view(ints)[:] = new[changed]
    return payload.data, num_changed


def apply_sparse(destination: memoryview, payload: memoryview, dtype: str, num_changed: int) -> None:
    """Write the changed elements of ``payload`` into ``destination`` (which holds the base bytes)."""
    if len(payload) != sparse_bytes(num_changed, dtype):
        raise DeltaError(f"sparse payload of {len(payload)} bytes for {num_changed} changes of {dtype}")
    if not num_changed:
        return
    ints = _INT_OF_SIZE[itemsize_of(dtype)]
    split = 4 * num_changed
    indices = np.frombuffer(payload[:split], dtype=np.int32)
    values = np.frombuffer(payload[split:], dtype=ints)
    target = np.frombuffer(destination, dtype=ints)
    if int(indices.max()) >= target.size or int(indices.min()) < 0:
        raise DeltaError("sparse payload indexes past the entry")
    target[indices] = values
