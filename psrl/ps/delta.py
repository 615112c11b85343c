"""Sparse deltas of one entry between two versions, packed to about two bytes per changed element.

In RL fine-tuning served in bf16, only a few percent of the elements change from one step to the
next (a small update moves most values by less than one bf16 step), and those that change mostly
move by one or a few units in the last place. A puller that holds version ``b`` fetches ``b -> v``
for each entry where the payload below is at most ``MAX_SPARSE_FRACTION`` of the entry.

Elements are compared and differenced as integers of their width, so the reconstruction is exact
bit for bit (NaNs and signed zeros included), and the puller checks every entry against its
checksum like any other. Payload (little-endian)::

    header   32 bytes: magic b"PSD\\x02", element width, long-skip width, 2 reserved zero bytes,
             then uint64 counts: changed elements n, long skips, wide values
    skips    n x uint8: unchanged elements before each changed one (after the previous one);
             255 = the skip is the next entry of the long-skip array
    long     uint32 each (uint64 when the entry has 2**32 elements or more)
    diffs    n x int8: new - old as integers of the element width, wrapped;
             -128 = the new value is the next entry of the wide array
    wide     full-width new values

``apply_sparse`` validates the whole payload before it writes anything, so a bad payload raises
``DeltaError`` and leaves the destination as it was.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from psrl.ps.dtypes import itemsize_of

DENSE = 0
SPARSE = 2  # this format (1 was the earlier int32-index + full-value format; refused)
# A sparse entry is sent only when it is at most this fraction of the dense bytes.
MAX_SPARSE_FRACTION = 0.5

MAGIC = b"PSD\x02"
_HEADER = struct.Struct("<4sBBxxQQQ")
HEADER_BYTES = _HEADER.size
SKIP_ESCAPE = 255
DIFF_ESCAPE = -128
# Signed so that differences wrap in the element's width (numpy array arithmetic wraps silently).
_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


class DeltaError(ValueError):
    """A sparse payload that does not fit the entry it claims to update."""


def long_skip_width(num_elems: int) -> int:
    return 8 if num_elems >= 2**32 else 4


def _width(ints: type[np.signedinteger]) -> int:
    return np.dtype(ints).itemsize


def _ints(dtype: str) -> type[np.signedinteger]:
    return _INT_OF_SIZE[itemsize_of(dtype)]  # type: ignore[return-value]


# encoding ---------------------------------------------------------------------------------------


def encode_sparse(base: memoryview, target: memoryview, dtype: str) -> memoryview | None:
    """The payload turning ``base`` into ``target``, or None when sending ``target`` whole is as cheap."""
    if len(base) != len(target) or not len(target):
        return None
    ints = _ints(dtype)
    old = np.frombuffer(base, dtype=ints)
    new = np.frombuffer(target, dtype=ints)
    changed = np.flatnonzero(old != new)
    budget = MAX_SPARSE_FRACTION * len(target)
    if HEADER_BYTES + 2 * changed.size > budget:  # skips and diffs alone are over: skip the rest
        return None
    skips, long_skips = _encode_skips(changed, long_skip_width(new.size))
    new_values = new[changed]
    diffs, wide = _encode_diffs(new_values - old[changed], new_values)  # wraps
    size = HEADER_BYTES + skips.nbytes + long_skips.nbytes + diffs.nbytes + wide.nbytes
    if size > budget:
        return None
    payload = np.empty(size, dtype=np.uint8)
    _HEADER.pack_into(
        payload.data, 0, MAGIC, _width(ints), long_skips.itemsize, changed.size, long_skips.size, wide.size
    )
    offset = HEADER_BYTES
    for section in (skips, long_skips, diffs, wide):
        payload[offset : offset + section.nbytes] = section.view(np.uint8)
        offset += section.nbytes
    return payload.data


def _encode_skips(changed: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 gaps between consecutive changed indices, and the long gaps they escape to."""
    gaps = np.empty_like(changed)
    if changed.size:
        gaps[0] = changed[0]
        np.subtract(changed[1:], changed[:-1], out=gaps[1:])
        gaps[1:] -= 1
    long_skips = gaps[gaps >= SKIP_ESCAPE].astype(np.uint32 if width == 4 else np.uint64)
    return np.minimum(gaps, SKIP_ESCAPE).astype(np.uint8), long_skips


def _encode_diffs(differences: np.ndarray, new_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 wrapped differences, and the full new values of those that do not fit in -127..127."""
    shifted = differences + np.array(127, dtype=differences.dtype)  # may wrap; then it is far above 254
    is_wide = shifted.view(np.dtype(f"u{shifted.itemsize}")) > 2 * 127
    diffs = differences.astype(np.int8)
    diffs[is_wide] = DIFF_ESCAPE
    return diffs, new_values[is_wide]


# decoding ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sections:
    skips: np.ndarray
    long_skips: np.ndarray
    diffs: np.ndarray
    wide: np.ndarray


def apply_sparse(destination: memoryview, payload: memoryview, dtype: str) -> int:
    """Turn ``destination`` (the base bytes) into the target; returns the number of changed elements.

    Raises DeltaError, with ``destination`` untouched, when the payload does not fit it.
    """
    ints = _ints(dtype)
    if len(destination) % _width(ints):
        raise DeltaError(f"destination of {len(destination)} bytes is not a whole number of {dtype} elements")
    target = np.frombuffer(destination, dtype=ints)
    sections = _split(payload, ints, target.size)
    indices = _indices(sections, target.size)
    values = _new_values(sections, target[indices])
    target[indices] = values  # the only write, after every check
    return int(indices.size)


def _split(payload: memoryview, ints: type[np.signedinteger], num_elems: int) -> _Sections:
    """The payload's sections, checked against its header and the entry's size."""
    if len(payload) < HEADER_BYTES:
        raise DeltaError(f"sparse payload of {len(payload)} bytes is shorter than its {HEADER_BYTES}-byte header")
    magic, width, skip_width, num_changed, num_long, num_wide = _HEADER.unpack_from(payload, 0)
    if magic != MAGIC:
        raise DeltaError(f"sparse payload starts with {magic!r}, not {MAGIC!r} (another format version?)")
    if width != _width(ints) or skip_width != long_skip_width(num_elems):
        raise DeltaError(
            f"sparse payload of {width}-byte elements / {skip_width}-byte long skips for an entry of "
            f"{_width(ints)}-byte elements / {long_skip_width(num_elems)}-byte long skips"
        )
    if num_changed > num_elems or num_long > num_changed or num_wide > num_changed:
        raise DeltaError(f"sparse payload counts ({num_changed}, {num_long}, {num_wide}) exceed {num_elems} elements")
    lengths = (num_changed, num_long * skip_width, num_changed, num_wide * width)
    if HEADER_BYTES + sum(lengths) != len(payload):
        raise DeltaError(f"sparse payload of {len(payload)} bytes; its header describes {HEADER_BYTES + sum(lengths)}")
    raw = np.frombuffer(payload, dtype=np.uint8)
    bounds = np.cumsum((HEADER_BYTES, *lengths))
    section = [raw[bounds[i] : bounds[i + 1]] for i in range(4)]
    long_type = np.uint32 if skip_width == 4 else np.uint64
    return _Sections(section[0], section[1].view(long_type), section[2].view(np.int8), section[3].view(ints))


def _indices(sections: _Sections, num_elems: int) -> np.ndarray:
    """Changed indices (strictly increasing), checked to stay inside the entry."""
    is_long = sections.skips == SKIP_ESCAPE
    num_long = int(np.count_nonzero(is_long))
    if num_long != sections.long_skips.size:
        raise DeltaError(f"{num_long} long-skip escapes for {sections.long_skips.size} long skips")
    # Bound the long skips in floating point first (with slack for rounding), so that the exact
    # integer sum below cannot overflow; the exact check follows.
    if float(sections.long_skips.sum(dtype=np.float64)) > 1.001 * num_elems + 1.0:
        raise DeltaError("sparse payload skips past the end of the entry")
    indices = sections.skips.astype(np.int64)
    if num_long:
        indices[is_long] = sections.long_skips
    indices += 1  # each changed element advances one past its skip
    np.cumsum(indices, out=indices)
    indices -= 1
    if indices.size and int(indices[-1]) >= num_elems:
        raise DeltaError(f"sparse payload changes element {int(indices[-1])} of an entry of {num_elems}")
    return indices


def _new_values(sections: _Sections, old_values: np.ndarray) -> np.ndarray:
    """``old_values`` (a gathered copy) turned into the new ones in place."""
    is_wide = sections.diffs == DIFF_ESCAPE
    num_wide = int(np.count_nonzero(is_wide))
    if num_wide != sections.wide.size:
        raise DeltaError(f"{num_wide} wide-value escapes for {sections.wide.size} wide values")
    old_values += sections.diffs  # wraps, as the encoder's subtraction did
    if num_wide:
        old_values[is_wide] = sections.wide
    return old_values
