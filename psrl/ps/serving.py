"""How a shard serves a landed version: as pushed, or cast to the rollout dtype.

Casting at the shard (once per version) instead of at every puller halves the bytes each rollout
instance pulls when training runs in fp32 and rollout in bf16. The cast copy gets its own layout
and checksums, so pullers verify exactly the bytes they receive.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from psrl.ps.checksum import checksum
from psrl.ps.dtypes import itemsize_of, tensor_from_buffer
from psrl.ps.manifest import NO_CHECKSUM, ManifestEntry, shard_offsets

FLOATING = frozenset({"float32", "float16", "bfloat16", "float64"})


def needs_cast(entries: Sequence[ManifestEntry], serve_dtype: str | None) -> bool:
    return serve_dtype is not None and any(e.dtype in FLOATING and e.dtype != serve_dtype for e in entries)


def served_layout(entries: Sequence[ManifestEntry], serve_dtype: str) -> tuple[ManifestEntry, ...]:
    """The entries as a shard serves them: floating ones in ``serve_dtype``, re-laid out (checksums to fill)."""
    served_dtypes = [serve_dtype if e.dtype in FLOATING else e.dtype for e in entries]
    sizes = [e.num_elems * itemsize_of(d) for e, d in zip(entries, served_dtypes, strict=True)]
    offsets, _ = shard_offsets(sizes)
    return tuple(
        msgspec.structs.replace(e, dtype=d, num_bytes=n, shard_offset=o, checksum=0)
        for e, d, n, o in zip(entries, served_dtypes, sizes, offsets, strict=True)
    )


def cast_entry(
    source: memoryview, entry: ManifestEntry, target: memoryview, served: ManifestEntry, algorithm: str
) -> ManifestEntry:
    """Cast one entry's bytes into its served slot; returns the served entry with its checksum."""
    tensor_from_buffer(target, served.dtype).copy_(tensor_from_buffer(source, entry.dtype))
    return msgspec.structs.replace(served, checksum=checksum(target) if algorithm != NO_CHECKSUM else 0)


def land_entry(
    entry: ManifestEntry,
    source: memoryview,
    algorithm: str,
    cast_to: tuple[ManifestEntry, memoryview] | None,
    verify: bool = True,
) -> ManifestEntry | None:
    """Check a pushed entry (its size only, without ``verify``) and, when the shard serves another dtype,
    cast it: the served entry, or None."""
    if not is_intact(entry, source, algorithm if verify else NO_CHECKSUM):
        return None
    if cast_to is None:
        return entry
    served, target = cast_to
    return cast_entry(source, entry, target, served, algorithm)


def is_intact(entry: ManifestEntry, view: memoryview, algorithm: str) -> bool:
    """Whether ``view`` holds exactly the bytes the manifest describes."""
    if len(view) != entry.num_bytes:
        return False
    return algorithm == NO_CHECKSUM or checksum(view) == entry.checksum
