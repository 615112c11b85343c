"""Version manifests: every entry's name, shape, dtype, shard, byte offset and checksum, plus a digest.

The pusher builds the manifest of a version from the trainer's tensors (the *push manifest*,
in the training dtype). A shard that serves another dtype re-derives its part of the manifest after
casting (the *served* entries). The push manifest's digest identifies the version everywhere: a
puller refuses to combine shards that report different digests for the same version number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import msgspec
import torch

from psrl.ps.checksum import ALGORITHM, checksum, digest
from psrl.ps.dtypes import byte_view, itemsize_of
from psrl.ps.plan import PlanEntry, ShardPlan, TensorSpec

NO_CHECKSUM = "none"
# Entries start on 64-byte boundaries in a shard's buffer (cache lines; NIXL and torch views like it).
ALIGNMENT = 64


class ManifestError(ValueError):
    """A manifest that does not match the tensors or the shard layout it claims to describe."""


class ManifestEntry(msgspec.Struct, array_like=True, frozen=True, gc=False):
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    shard: int
    elem_start: int
    num_elems: int
    shard_offset: int
    num_bytes: int
    checksum: int

    @property
    def is_whole_tensor(self) -> bool:
        total = 1
        for dim in self.shape:
            total *= dim
        return self.elem_start == 0 and self.num_elems == total

    def byte_range(self) -> tuple[int, int]:
        """Byte range of this entry inside the flattened tensor."""
        size = itemsize_of(self.dtype)
        return self.elem_start * size, (self.elem_start + self.num_elems) * size


class Manifest(msgspec.Struct, array_like=True, frozen=True, gc=False):
    version: int
    num_shards: int
    algorithm: str
    entries: tuple[ManifestEntry, ...]

    def digest(self) -> bytes:
        return digest(msgspec.msgpack.encode(self))

    def shard_part(self, shard: int) -> tuple[ManifestEntry, ...]:
        return tuple(e for e in self.entries if e.shard == shard)

    @property
    def total_bytes(self) -> int:
        return sum(e.num_bytes for e in self.entries)

    def tensor_specs(self) -> list[TensorSpec]:
        seen: dict[str, TensorSpec] = {}
        for e in self.entries:
            seen.setdefault(e.name, TensorSpec(e.name, e.shape, e.dtype))
        return list(seen.values())


def aligned(offset: int) -> int:
    return (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def shard_offsets(sizes: Iterable[int]) -> tuple[list[int], int]:
    """Aligned offsets of consecutive entries in one shard buffer, and the buffer's size."""
    offsets = []
    cursor = 0
    for size in sizes:
        offsets.append(cursor)
        cursor = aligned(cursor + size)
    return offsets, cursor


def entry_bytes(tensors: Mapping[str, torch.Tensor], entry: PlanEntry | ManifestEntry) -> memoryview:
    """The bytes of one entry, viewed in place in the trainer's tensor."""
    tensor = tensors[entry.name]
    size = itemsize_of(entry.dtype)
    start = entry.elem_start * size
    return byte_view(tensor)[start : start + entry.num_elems * size]


def _hash_when_ready(tensors: Mapping[str, torch.Tensor], entry: PlanEntry, ready: Callable[[str], None] | None) -> int:
    if ready is not None:
        ready(entry.name)
    return checksum(entry_bytes(tensors, entry))


def build_manifest(
    version: int,
    plan: ShardPlan,
    tensors: Mapping[str, torch.Tensor],
    with_checksums: bool = True,
    num_threads: int = 1,
    ready: Callable[[str], None] | None = None,
    deferred: bool = False,
) -> Manifest:
    """The push manifest of ``tensors`` laid out by ``plan``; checks that tensors match the plan.

    Checksums run on ``num_threads`` threads (xxh3 releases the GIL); ``ready(name)`` blocks until a
    tensor's bytes are there (staging copies still in flight), so hashing overlaps them.
    ``deferred``: the checksums follow (0 here; ``with_sums`` fills them in): the transport hashes each
    entry where it writes it. ``tensors`` may then live on a device (or be meta tensors).
    """
    _check_tensors(plan, tensors, need_host_bytes=with_checksums and not deferred)
    if deferred:
        with_checksums = False
    offsets: dict[int, int] = {}
    for shard in range(plan.num_shards):
        part = plan.shard_entries(shard)
        for entry, offset in zip(part, shard_offsets(e.num_bytes for e in part)[0], strict=True):
            offsets[entry.index] = offset
    if with_checksums:
        with ThreadPoolExecutor(max_workers=max(1, num_threads)) as pool:
            sums = list(pool.map(lambda e: _hash_when_ready(tensors, e, ready), plan.entries))
    else:
        sums = [0] * len(plan.entries)
    entries = tuple(
        ManifestEntry(
            index=e.index,
            name=e.name,
            shape=e.shape,
            dtype=e.dtype,
            shard=e.shard,
            elem_start=e.elem_start,
            num_elems=e.num_elems,
            shard_offset=offsets[e.index],
            num_bytes=e.num_bytes,
            checksum=value,
        )
        for e, value in zip(plan.entries, sums, strict=True)
    )
    algorithm = ALGORITHM if with_checksums or deferred else NO_CHECKSUM
    return Manifest(version=version, num_shards=plan.num_shards, algorithm=algorithm, entries=entries)


def with_sums(manifest: Manifest, sums: Mapping[int, int]) -> Manifest:
    """``manifest`` with the checksums of a deferred push (entry index -> checksum) filled in."""
    entries = tuple(msgspec.structs.replace(e, checksum=sums[e.index]) for e in manifest.entries)
    return msgspec.structs.replace(manifest, entries=entries)


def _check_tensors(plan: ShardPlan, tensors: Mapping[str, torch.Tensor], need_host_bytes: bool = True) -> None:
    expected = {e.name: TensorSpec(e.name, e.shape, e.dtype) for e in plan.entries}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ManifestError(f"tensors do not match the plan: missing={missing[:5]} unexpected={extra[:5]}")
    for name, spec in expected.items():
        got = TensorSpec.of(name, tensors[name])
        if got != spec:
            raise ManifestError(f"tensor {name}: plan has {spec.shape} {spec.dtype}, got {got.shape} {got.dtype}")
        if need_host_bytes and (not tensors[name].is_contiguous() or tensors[name].device.type != "cpu"):
            raise ManifestError(f"tensor {name} must be a contiguous CPU tensor")


def validate_served_parts(version: int, parts: Sequence[Sequence[ManifestEntry]], num_entries: int) -> None:
    """Shards' served entries must cover every entry index exactly once, each from its own shard."""
    seen = [False] * num_entries
    for shard, part in enumerate(parts):
        for entry in part:
            if entry.shard != shard or not 0 <= entry.index < num_entries or seen[entry.index]:
                raise ManifestError(f"version {version}: shard {shard} reports an inconsistent entry {entry.index}")
            seen[entry.index] = True
    if not all(seen):
        raise ManifestError(f"version {version}: shards cover {sum(seen)} of {num_entries} entries")
