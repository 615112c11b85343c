"""numpy arrays inside messages: inline below a size threshold, zero-copy trailing frames above it.

An array is a msgpack extension value whose data starts with a header::

    u8 len(dtype) | dtype (numpy array-protocol string, little-endian, e.g. "<i4") | u8 ndim | ndim x u64 dims

followed by the raw bytes (``INLINE_EXT``) or by a u32 index into the message's trailing frames
(``FRAME_EXT``), which are sent with ``copy=False``. Only plain numeric dtypes are accepted, and
every count is checked against the bytes actually present, so hostile input cannot make numpy
read out of bounds or build object arrays.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from bus.errors import DecodeError, DropReason

INLINE_EXT = 1
FRAME_EXT = 2
MAX_NDIM = 8
MAX_ARRAY_FRAMES = 64
ALLOWED_DTYPES = frozenset({"|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8"})
_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")

Buffer = bytes | memoryview


def as_numpy(obj: Any) -> np.ndarray:
    """A C-contiguous little-endian numpy array of `obj` (numpy array or CPU torch tensor)."""
    if not isinstance(obj, np.ndarray):
        if type(obj).__module__.split(".", 1)[0] != "torch":
            raise TypeError(f"cannot encode {type(obj).__name__} on the bus")
        obj = obj.detach().cpu().contiguous().numpy()
    arr = np.ascontiguousarray(obj)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.dtype.str not in ALLOWED_DTYPES:
        raise TypeError(f"array dtype {arr.dtype} cannot travel on the bus; use one of {sorted(ALLOWED_DTYPES)}")
    return arr


def _header(arr: np.ndarray) -> bytes:
    dtype = arr.dtype.str.encode("ascii")
    dims = struct.pack(f"<B{arr.ndim}Q", arr.ndim, *arr.shape)
    return _U8.pack(len(dtype)) + dtype + dims


def encode_array(obj: Any, frames: list[Buffer], threshold_bytes: int) -> msgspec.msgpack.Ext:
    """The extension value of one array; large arrays append their buffer to `frames`."""
    arr = as_numpy(obj)
    if arr.nbytes < threshold_bytes or len(frames) >= MAX_ARRAY_FRAMES:
        return msgspec.msgpack.Ext(INLINE_EXT, _header(arr) + arr.tobytes())
    frames.append(memoryview(arr.data).cast("B"))
    return msgspec.msgpack.Ext(FRAME_EXT, _header(arr) + _U32.pack(len(frames) - 1))


def _malformed(detail: str) -> DecodeError:
    return DecodeError(DropReason.MALFORMED, f"array: {detail}")


def _read_header(data: memoryview) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """dtype, shape and the offset just past the header; raises DecodeError on any inconsistency."""
    if len(data) < 2:
        raise _malformed("header too short")
    dtype_len = data[0]
    end = 1 + dtype_len
    if len(data) < end + 1:
        raise _malformed("header too short")
    dtype_str = bytes(data[1:end]).decode("ascii", errors="replace")
    if dtype_str not in ALLOWED_DTYPES:
        raise _malformed(f"dtype {dtype_str!r} not allowed")
    ndim = data[end]
    if ndim > MAX_NDIM:
        raise _malformed(f"{ndim} dimensions (at most {MAX_NDIM})")
    dims_end = end + 1 + 8 * ndim
    if len(data) < dims_end:
        raise _malformed("header too short for its dimensions")
    shape = struct.unpack_from(f"<{ndim}Q", data, end + 1)
    return np.dtype(dtype_str), shape, dims_end


def _checked_array(raw: Buffer, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    num_items = 1
    for dim in shape:
        num_items *= dim
    if num_items * dtype.itemsize != len(raw):
        raise _malformed(f"shape {shape} of {dtype} needs {num_items * dtype.itemsize} bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def decode_array(code: int, data: memoryview, frames: Sequence[Buffer], used: list[int]) -> np.ndarray:
    """Rebuild an array from its extension value; `used` collects the frame indices referenced."""
    dtype, shape, offset = _read_header(data)
    if code == INLINE_EXT:
        # msgspec's view is only valid during the hook: copy the (small) inline data out.
        return _checked_array(bytes(data[offset:]), dtype, shape)
    if code == FRAME_EXT:
        if len(data) != offset + 4:
            raise _malformed("frame reference has trailing bytes")
        index = _U32.unpack_from(data, offset)[0]
        if index >= len(frames):
            raise _malformed(f"refers to frame {index} of {len(frames)}")
        used.append(index)
        return _checked_array(frames[index], dtype, shape)
    raise _malformed(f"unknown extension code {code}")
