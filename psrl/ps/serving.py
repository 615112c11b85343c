"""How a shard serves a landed version: as pushed, or cast to the rollout dtype.

Casting at the shard (once per version) instead of at every puller halves the bytes each rollout
instance pulls when training runs in fp32 and rollout in bf16. The cast copy gets its own layout
and checksums, so pullers verify exactly the bytes they receive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from psrl.ps.checksum import checksum
from psrl.ps.dtypes import itemsize_of, tensor_from_buffer
from psrl.ps.manifest import NO_CHECKSUM, ManifestEntry, shard_offsets
from psrl.ps.transports.base import EntryBuffers

FLOATING = frozenset({"float32", "float16", "bfloat16", "float64"})


def needs_cast(entries: Sequence[ManifestEntry], serve_dtype: str | None) -> bool:
    return serve_dtype is not None and any(e.dtype in FLOATING and e.dtype != serve_dtype for e in entries)


def cast_entries(
    entries: Sequence[ManifestEntry],
    buffers: EntryBuffers,
    serve_dtype: str,
    algorithm: str,
    allocate: Callable[[Sequence[ManifestEntry]], EntryBuffers],
) -> tuple[tuple[ManifestEntry, ...], EntryBuffers]:
    """Floating entries cast to ``serve_dtype`` in a new contiguous buffer; others copied as they are."""
    served_dtypes = [serve_dtype if e.dtype in FLOATING else e.dtype for e in entries]
    sizes = [e.num_elems * itemsize_of(d) for e, d in zip(entries, served_dtypes, strict=True)]
    offsets, _ = shard_offsets(sizes)
    draft = [
        msgspec.structs.replace(e, dtype=d, num_bytes=n, shard_offset=o)
        for e, d, n, o in zip(entries, served_dtypes, sizes, offsets, strict=True)
    ]
    out = allocate(draft)
    served = []
    for entry, target in zip(entries, draft, strict=True):
        src = tensor_from_buffer(buffers.view(entry.index), entry.dtype)
        dst_view = out.view(entry.index)
        tensor_from_buffer(dst_view, target.dtype).copy_(src)
        value = checksum(dst_view) if algorithm != NO_CHECKSUM else 0
        served.append(msgspec.structs.replace(target, checksum=value))
    return tuple(served), out


def is_intact(entry: ManifestEntry, view: memoryview, algorithm: str) -> bool:
    """Whether ``view`` holds exactly the bytes the manifest describes."""
    if len(view) != entry.num_bytes:
        return False
    return algorithm == NO_CHECKSUM or checksum(view) == entry.checksum
