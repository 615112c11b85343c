"""Checksums of weight bytes: xxh3-64 on the hot path, xxh3-128 for manifest digests.

xxh3 runs at more than 10 GB/s on one core here (CRC32 manages about 4 GB/s), so verifying every
chunk costs a small fraction of a transfer that runs at the loopback's 2-4 GB/s.

A word sum (the bytes' little-endian 64-bit words added modulo 2**64) is what a GPU computes in any
order at its memory's speed: a push from the trainer's GPU takes one of each entry on the device and
compares it with the bytes that landed in host memory, in the same pass that hashes them.
"""

from __future__ import annotations

import numpy as np
import xxhash
from typing_extensions import Buffer

ALGORITHM = "xxh3_64"
WORD_BYTES = 8
WORD_SUM_MASK = (1 << 64) - 1
# hashed and summed while in the cache: one read of memory for both
_PIECE_BYTES = 4 << 20


def checksum(data: Buffer) -> int:
    """64-bit checksum of a contiguous buffer."""
    return int(xxhash.xxh3_64_intdigest(data))


def digest(data: Buffer) -> bytes:
    """128-bit digest identifying a manifest (a version's exact layout and contents)."""
    return bytes(xxhash.xxh3_128_digest(data))


def checksum_and_word_sum(data: Buffer) -> tuple[int, int]:
    """``checksum(data)`` and the word sum of ``data`` (its tail zero-padded to a word), in one pass."""
    view = memoryview(data).cast("B")
    hasher = xxhash.xxh3_64()
    total = 0
    whole = len(view) - len(view) % WORD_BYTES
    for start in range(0, whole, _PIECE_BYTES):
        piece = view[start : min(start + _PIECE_BYTES, whole)]
        hasher.update(piece)
        total += int(np.frombuffer(piece, dtype="<u8").sum(dtype=np.uint64))
    tail = view[whole:]
    hasher.update(tail)
    total += int.from_bytes(bytes(tail), "little")
    return int(hasher.intdigest()), total & WORD_SUM_MASK


def word_sum(data: Buffer) -> int:
    """The word sum of ``data`` alone (its tail zero-padded to a word); the sums of word-aligned pieces add up
    to the whole's, so a large buffer is summed by several threads while one hashes it."""
    view = memoryview(data).cast("B")
    whole = len(view) - len(view) % WORD_BYTES
    total = int(np.frombuffer(view[:whole], dtype="<u8").sum(dtype=np.uint64)) if whole else 0
    return (total + int.from_bytes(bytes(view[whole:]), "little")) & WORD_SUM_MASK
