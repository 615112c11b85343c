"""Checksums of weight bytes: xxh3-64 on the hot path, xxh3-128 for manifest digests.

xxh3 runs at more than 10 GB/s on one core here (CRC32 manages about 4 GB/s), so verifying every
chunk costs a small fraction of a transfer that runs at the loopback's 2-4 GB/s.

An entry larger than ``PIECE_BYTES`` is checksummed by pieces: the xxh3-64 of its pieces' xxh3-64 values
(little-endian, in order). The pieces can be hashed by as many threads as there are pieces: one thread
hashing a 0.5B model's 272 MB embedding was the tail of a version's push from the GPU, and a 7B model's
embedding is 1.09 GB. Manifests name the scheme (``ALGORITHM``), and a snapshot of another one is ignored.

A word sum (the bytes' little-endian 64-bit words added modulo 2**64) is what a GPU computes in any
order at its memory's speed: a push from the trainer's GPU takes one of each entry on the device and
compares it with the bytes that landed in host memory, in the same pass that hashes them.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

import numpy as np
import xxhash
from typing_extensions import Buffer

R = TypeVar("R")

ALGORITHM = "xxh3_64/16MiB"
PIECE_BYTES = 16 << 20  # a multiple of the word: only the last piece has a tail
WORD_BYTES = 8
WORD_SUM_MASK = (1 << 64) - 1
# hashed and summed while in the cache: one read of memory for both
_CACHED_BYTES = 4 << 20


def checksum(data: Buffer, pool: Executor | None = None) -> int:
    """64-bit checksum of a contiguous buffer (by pieces beyond ``PIECE_BYTES``, on ``pool`` when given)."""
    return _by_pieces(data, _xxh3, pool)


def _xxh3(data: Buffer) -> int:
    return int(xxhash.xxh3_64_intdigest(data))


def digest(data: Buffer) -> bytes:
    """128-bit digest identifying a manifest (a version's exact layout and contents)."""
    return bytes(xxhash.xxh3_128_digest(data))


def checksum_and_word_sum(data: Buffer, pool: Executor | None = None) -> tuple[int, int]:
    """``checksum(data)`` and the word sum of ``data`` (its tail zero-padded to a word), in one pass over each
    piece (the pieces on ``pool`` when given)."""
    view = memoryview(data).cast("B")
    if len(view) <= PIECE_BYTES:
        return _checksum_and_word_sum(view)
    pieces = _pieces(view, _checksum_and_word_sum, pool)
    digests = np.array([digest for digest, _ in pieces], dtype="<u8")
    return _xxh3(digests.tobytes()), sum(total for _, total in pieces) & WORD_SUM_MASK


def _by_pieces(data: Buffer, hash_piece: Callable[[memoryview], int], pool: Executor | None) -> int:
    view = memoryview(data).cast("B")
    if len(view) <= PIECE_BYTES:
        return hash_piece(view)
    return _xxh3(np.array(_pieces(view, hash_piece, pool), dtype="<u8").tobytes())


def _pieces(view: memoryview, job: Callable[[memoryview], R], pool: Executor | None) -> list[R]:
    parts = [view[start : start + PIECE_BYTES] for start in range(0, len(view), PIECE_BYTES)]
    if pool is None:
        return [job(part) for part in parts]
    return [future.result() for future in [pool.submit(job, part) for part in parts]]


def _checksum_and_word_sum(view: memoryview) -> tuple[int, int]:
    hasher = xxhash.xxh3_64()
    total = 0
    whole = len(view) - len(view) % WORD_BYTES
    for start in range(0, whole, _CACHED_BYTES):
        piece = view[start : min(start + _CACHED_BYTES, whole)]
        hasher.update(piece)
        total += int(np.frombuffer(piece, dtype="<u8").sum(dtype=np.uint64))
    tail = view[whole:]
    hasher.update(tail)
    total += int.from_bytes(bytes(tail), "little")
    return int(hasher.intdigest()), total & WORD_SUM_MASK
