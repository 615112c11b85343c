"""Sharding plan: which bytes of which tensor live on which parameter-server shard.

The unit of storage and transfer is an *entry*: a whole tensor, or a block of consecutive elements
of a tensor larger than the block limit. Entries are assigned to shards largest first, each to the
least loaded shard (longest-processing-time rule), so shard byte loads differ by at most one
block. Entries are numbered in model order, which is the order a puller loads them in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from psrl.ps.dtypes import dtype_name, itemsize_of


class PlanError(ValueError):
    """A plan was requested for an empty model, a bad shard count or a bad block size."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one model tensor (what a plan is computed from)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def num_elems(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return itemsize_of(self.dtype)

    @property
    def num_bytes(self) -> int:
        return self.num_elems * self.itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name=name, shape=tuple(tensor.shape), dtype=dtype_name(tensor.dtype))


@dataclass(frozen=True)
class PlanEntry:
    """One stored and transferred unit: elements [elem_start, elem_start + num_elems) of a tensor."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    shard: int
    elem_start: int
    num_elems: int
    itemsize: int

    @property
    def num_bytes(self) -> int:
        return self.num_elems * self.itemsize

    @property
    def is_whole_tensor(self) -> bool:
        return self.elem_start == 0 and self.num_elems == math.prod(self.shape)


@dataclass(frozen=True)
class ShardPlan:
    num_shards: int
    entries: tuple[PlanEntry, ...]

    def shard_entries(self, shard: int) -> tuple[PlanEntry, ...]:
        return tuple(e for e in self.entries if e.shard == shard)

    def shard_bytes(self) -> list[int]:
        loads = [0] * self.num_shards
        for entry in self.entries:
            loads[entry.shard] += entry.num_bytes
        return loads

    @property
    def total_bytes(self) -> int:
        return sum(e.num_bytes for e in self.entries)


def plan_shards(specs: Sequence[TensorSpec], num_shards: int, max_block_bytes: int) -> ShardPlan:
    """Split tensors into entries of at most ``max_block_bytes`` and balance them over the shards."""
    if num_shards < 1:
        raise PlanError(f"num_shards must be >= 1, got {num_shards}")
    if max_block_bytes < 1:
        raise PlanError(f"max_block_bytes must be >= 1, got {max_block_bytes}")
    if not specs:
        raise PlanError("cannot plan an empty model")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise PlanError("tensor names must be unique")
    pieces = list(_split(specs, max_block_bytes))
    shards = _assign_largest_first([n * size for _, _, n, size in pieces], num_shards)
    entries = tuple(
        PlanEntry(
            index=i,
            name=spec.name,
            shape=spec.shape,
            dtype=spec.dtype,
            shard=shards[i],
            elem_start=start,
            num_elems=count,
            itemsize=size,
        )
        for i, (spec, start, count, size) in enumerate(pieces)
    )
    return ShardPlan(num_shards=num_shards, entries=entries)


def _split(specs: Iterable[TensorSpec], max_block_bytes: int) -> Iterable[tuple[TensorSpec, int, int, int]]:
    """(spec, elem_start, num_elems, itemsize) pieces; blocks of one tensor have near-equal sizes."""
    for spec in specs:
        itemsize = spec.itemsize
        total = spec.num_elems
        num_blocks = max(1, math.ceil(total * itemsize / max_block_bytes))
        # A block holds at least one element even when one element exceeds the limit.
        per_block = max(1, math.ceil(total / num_blocks)) if total else 0
        if total == 0:
            yield spec, 0, 0, itemsize
            continue
        for start in range(0, total, per_block):
            yield spec, start, min(per_block, total - start), itemsize


def _assign_largest_first(sizes: Sequence[int], num_shards: int) -> list[int]:
    loads = [0] * num_shards
    shard_of = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(num_shards), key=lambda s: (loads[s], s))
        shard_of[i] = target
        loads[target] += sizes[i]
    return shard_of
