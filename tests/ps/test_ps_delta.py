"""Sparse deltas of one entry: exact round trips for every element width, the packed layout's
escapes, the dense fallback, and payloads that do not fit refused with the destination untouched."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from psrl.ps.delta import (
    DIFF_ESCAPE,
    HEADER_BYTES,
    MAGIC,
    MAX_SPARSE_FRACTION,
    SKIP_ESCAPE,
    DeltaError,
    apply_sparse,
    encode_sparse,
)

# One dtype per element width (the codec only sees the width), plus the floating ones served.
DTYPES = {"uint8": np.uint8, "bfloat16": np.uint16, "float16": np.uint16, "float32": np.uint32, "int64": np.uint64}


def _random(rng: np.random.Generator, size: int, ints: type) -> np.ndarray:
    return rng.integers(0, np.iinfo(ints).max, size=size, dtype=ints, endpoint=True)


def _round_trip(base: np.ndarray, target: np.ndarray, dtype: str) -> memoryview:
    payload = encode_sparse(memoryview(base).cast("B"), memoryview(target).cast("B"), dtype)
    assert payload is not None
    rebuilt = base.copy()
    num_changed = apply_sparse(memoryview(rebuilt).cast("B"), payload, dtype)
    assert num_changed == int((base != target).sum())
    assert np.array_equal(rebuilt, target)  # as unsigned integers: bit for bit
    return payload


def _sections(payload: memoryview) -> tuple[int, int, int, int, int]:
    """(element width, long-skip width, changed, long skips, wide values) from the header."""
    magic, width, skip_width, changed, num_long, num_wide = struct.unpack_from("<4sBBxxQQQ", payload)
    assert magic == MAGIC
    return width, skip_width, changed, num_long, num_wide


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_round_trip_is_bit_exact_for_every_width(dtype: str) -> None:
    ints = DTYPES[dtype]
    rng = np.random.default_rng(0)
    base = _random(rng, 20_000, ints)
    target = base.copy()
    changed = rng.choice(base.size, 300, replace=False)
    target[changed[:200]] += ints(1)  # small moves: one int8 difference each (wrapping at the top)
    target[changed[200:]] = _random(rng, 100, ints)  # arbitrary new values: mostly wide escapes
    target[0] = base[0] - ints(1)  # the first element, a negative difference
    target[-1] = base[-1] + ints(127)  # the last element, the largest difference that fits
    payload = _round_trip(base, target, dtype)
    width, _, num_changed, _, num_wide = _sections(payload)
    assert width == np.dtype(ints).itemsize and num_changed == int((base != target).sum())
    assert num_wide <= 100 + 2  # the small moves never escape


@pytest.mark.parametrize("dtype", ["uint8", "bfloat16", "float32"])
def test_long_skips_beyond_a_byte_and_beyond_16_bits(dtype: str) -> None:
    ints = DTYPES[dtype]
    base = np.zeros(300_000, dtype=ints)
    target = base.copy()
    positions = [254, 255 + 254, 255 + 254 + 256, 70_000, 70_000 + 2**16 + 7, 299_999]
    target[positions] = 3
    payload = _round_trip(base, target, dtype)
    _, skip_width, num_changed, num_long, num_wide = _sections(payload)
    assert (skip_width, num_changed, num_wide) == (4, len(positions), 0)
    # Gaps 254 and 254 fit in a byte; 255 is the first that escapes; the rest are long.
    assert num_long == 4
    raw = np.frombuffer(payload, dtype=np.uint8)
    assert list(raw[HEADER_BYTES : HEADER_BYTES + len(positions)]) == [254, 254, SKIP_ESCAPE] + [SKIP_ESCAPE] * 3


def test_differences_wrap_and_minus_128_escapes() -> None:
    base = np.full(1000, 5, dtype=np.uint16)
    base[:2] = [0x7FFF, 0x8000]
    target = base.copy()
    # +1 and -1 across the signed boundary; -128 and +128 do not fit an int8 slot; -127 does.
    target[:5] = [0x8000, 0x7FFF, 5 - 128 + 65536, 5 + 128, 5 - 127 + 65536]
    payload = _round_trip(base, target, "bfloat16")
    _, _, num_changed, _, num_wide = _sections(payload)
    assert (num_changed, num_wide) == (5, 2)
    diffs = np.frombuffer(payload, dtype=np.int8)[HEADER_BYTES + num_changed : HEADER_BYTES + 2 * num_changed]
    assert list(diffs[:5]) == [1, -1, DIFF_ESCAPE, DIFF_ESCAPE, -127]


def test_nan_payloads_and_signed_zeros_compare_as_bits() -> None:
    base = np.array([0.0, -0.0, np.nan, 1.0] * 500, dtype=np.float32).view(np.uint32)
    target = base.copy()
    target[0] = np.array([-0.0], dtype=np.float32).view(np.uint32)[0]  # equal as a value, not as bits
    target[2] = 0x7FC00001  # another NaN
    payload = _round_trip(base, target, "float32")
    assert _sections(payload)[2] == 2


def test_no_change_encodes_an_empty_delta() -> None:
    base = np.arange(1000, dtype=np.uint16)
    payload = _round_trip(base, base.copy(), "bfloat16")
    assert len(payload) == HEADER_BYTES


def test_empty_entries_and_mismatched_sizes_are_not_encoded() -> None:
    assert encode_sparse(memoryview(b""), memoryview(b""), "bfloat16") is None
    assert encode_sparse(memoryview(bytes(8)), memoryview(bytes(10)), "bfloat16") is None


def test_dense_changes_fall_back_to_whole_entries() -> None:
    rng = np.random.default_rng(1)
    base = _random(rng, 10_000, np.uint16)
    everything = base + np.uint16(1)  # every element changes: 2 bytes each, the entry's own size
    assert encode_sparse(memoryview(base).cast("B"), memoryview(everything).cast("B"), "bfloat16") is None
    # bf16 changes by one ulp cost 2 bytes each, an element's size: the budget is that fraction of them.
    for num_changed, fits in (
        (int(base.size * MAX_SPARSE_FRACTION) - 100, True),
        (int(base.size * MAX_SPARSE_FRACTION) + 10, False),
    ):
        target = base.copy()
        target[:num_changed] += np.uint16(1)
        payload = encode_sparse(memoryview(base).cast("B"), memoryview(target).cast("B"), "bfloat16")
        assert (payload is not None) == fits


def test_all_changed_round_trip() -> None:
    # 8-byte elements: even a delta that changes every element (2 bytes each) is under the budget.
    rng = np.random.default_rng(2)
    base = _random(rng, 4000, np.uint64)
    target = base + np.uint64(3)
    payload = _round_trip(base, target, "int64")
    assert _sections(payload)[2] == base.size


@pytest.mark.parametrize("seed", range(6))
def test_random_deltas_round_trip(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    dtype = sorted(DTYPES)[seed % len(DTYPES)]
    ints = DTYPES[dtype]
    size = int(rng.integers(1000, 200_000))
    base = _random(rng, size, ints)
    target = base.copy()
    density = float(rng.choice([1e-5, 1e-3, 0.02, 0.1]))
    changed = np.flatnonzero(rng.random(size) < density)
    moves = rng.integers(-300, 300, size=changed.size).astype(ints)  # wraps: small moves either way
    target[changed] += moves
    _round_trip(base, target, dtype)


# refused payloads ----------------------------------------------------------------------------------------


def _valid_payload() -> tuple[np.ndarray, bytes]:
    base = np.zeros(1000, dtype=np.uint16)
    target = base.copy()
    target[[3, 500, 999]] = [1, 9000, 2]  # one long skip, one wide value
    payload = encode_sparse(memoryview(base).cast("B"), memoryview(target).cast("B"), "bfloat16")
    assert payload is not None
    return base, bytes(payload)


def _refused(payload: bytes, dtype: str = "bfloat16", size: int = 1000) -> None:
    destination = np.arange(size, dtype=np.uint16 if dtype == "bfloat16" else np.uint32)
    before = destination.copy()
    with pytest.raises(DeltaError):
        apply_sparse(memoryview(destination).cast("B"), memoryview(bytearray(payload)), dtype)
    assert np.array_equal(destination, before)  # nothing was written


def test_truncated_and_extended_payloads_are_refused() -> None:
    _, payload = _valid_payload()
    for cut in (0, 7, HEADER_BYTES - 1, HEADER_BYTES, len(payload) - 1):
        _refused(payload[:cut])
    _refused(payload + b"\0")


def test_header_fields_that_do_not_fit_are_refused() -> None:
    _, payload = _valid_payload()
    header = list(struct.unpack_from("<4sBBxxQQQ", payload))
    assert header[3:] == [3, 2, 1]  # changed, long skips, wide values
    for field, value in ((0, b"PSD\x01"), (1, 4), (2, 8), (3, 10**6), (3, 4), (4, 1), (4, 3), (5, 0), (5, 3)):
        changed = header.copy()
        changed[field] = value
        _refused(struct.pack("<4sBBxxQQQ", *changed) + payload[HEADER_BYTES:])
    _refused(payload, dtype="float32", size=500)  # same bytes, other element width


def test_escape_counts_that_disagree_with_their_arrays_are_refused() -> None:
    _, payload = _valid_payload()
    skips = HEADER_BYTES  # 3 skips: 3, then two long ones (496, 498)
    diffs = HEADER_BYTES + 3 + 2 * 4  # 3 diffs: 1, the escape of 9000, 2
    for offset, value in ((skips, SKIP_ESCAPE), (skips + 1, 0), (diffs, DIFF_ESCAPE), (diffs + 1, 1)):
        broken = bytearray(payload)
        broken[offset] = value & 0xFF
        _refused(bytes(broken))


def test_skips_past_the_end_are_refused_without_overflow() -> None:
    _, payload = _valid_payload()
    long_at = HEADER_BYTES + 3
    for long_skip in (1000, 2**32 - 1):
        broken = bytearray(payload)
        struct.pack_into("<I", broken, long_at, long_skip)
        _refused(bytes(broken))
    base = np.zeros(2000, dtype=np.uint16)  # many short skips that add up past the end
    target = base.copy()
    target[254::255] = 1
    payload_ok = encode_sparse(memoryview(base).cast("B"), memoryview(target).cast("B"), "bfloat16")
    assert payload_ok is not None
    _refused(bytes(payload_ok), size=1500)
