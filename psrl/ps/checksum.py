"""Checksums of weight bytes: xxh3-64 on the hot path, xxh3-128 for manifest digests.

xxh3 runs at more than 10 GB/s on one core here (CRC32 manages about 4 GB/s), so verifying every
chunk costs a small fraction of a transfer that runs at the loopback's 2-4 GB/s.
"""

from __future__ import annotations

import xxhash
from typing_extensions import Buffer

ALGORITHM = "xxh3_64"


def checksum(data: Buffer) -> int:
    """64-bit checksum of a contiguous buffer."""
    return int(xxhash.xxh3_64_intdigest(data))


def digest(data: Buffer) -> bytes:
    """128-bit digest identifying a manifest (a version's exact layout and contents)."""
    return bytes(xxhash.xxh3_128_digest(data))
