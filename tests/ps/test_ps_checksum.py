"""Entry checksums: xxh3-64 up to 16 MiB, beyond it the xxh3-64 of the pieces' values, the same whether the
pieces are hashed on one thread or many, and with the word sum taken in the same pass."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

from psrl.ps.checksum import PIECE_BYTES, WORD_SUM_MASK, checksum, checksum_and_word_sum


def _word_sum(data: np.ndarray) -> int:
    padded = np.zeros(-(-len(data) // 8) * 8, dtype=np.uint8)
    padded[: len(data)] = data
    return int(padded.view("<u8").sum(dtype=np.uint64)) & WORD_SUM_MASK


def test_a_small_entry_is_plain_xxh3_and_a_large_one_hashes_its_pieces_values() -> None:
    data = np.random.default_rng(0).integers(0, 256, size=2 * PIECE_BYTES + 4099, dtype=np.uint8)
    small = memoryview(data[:PIECE_BYTES])
    assert checksum(small) == xxhash.xxh3_64_intdigest(small)
    pieces = [xxhash.xxh3_64_intdigest(data[i : i + PIECE_BYTES]) for i in range(0, len(data), PIECE_BYTES)]
    expected = xxhash.xxh3_64_intdigest(np.array(pieces, dtype="<u8").tobytes())
    with ThreadPoolExecutor(max_workers=3) as pool:
        assert checksum(memoryview(data)) == checksum(memoryview(data), pool) == expected
        assert checksum_and_word_sum(memoryview(data), pool) == (expected, _word_sum(data))
        assert checksum_and_word_sum(memoryview(data)) == (expected, _word_sum(data))
    assert checksum_and_word_sum(memoryview(data[:13])) == (checksum(memoryview(data[:13])), _word_sum(data[:13]))


def test_one_changed_byte_in_any_piece_changes_the_checksum() -> None:
    data = np.zeros(PIECE_BYTES * 3, dtype=np.uint8)
    base = checksum(memoryview(data))
    for position in (5, PIECE_BYTES + 17, len(data) - 1):
        changed = data.copy()
        changed[position] = 1
        assert checksum(memoryview(changed)) != base, position
