"""numpy arrays inside messages: inline below a size threshold, zero-copy trailing frames above it.

An array is a msgpack extension value. A small one-dimensional array (``VECTOR_EXT``, the common
case: token ids, logprobs) is a u8 dtype code (its index in ``ALLOWED_DTYPES``) then the items.
Any other array starts with a header::

    u8 len(dtype) | dtype (numpy array-protocol string, little-endian, e.g. "<i4") | u8 ndim | ndim x u64 dims

followed by the raw bytes (``INLINE_EXT``) or by a u32 index into the message's trailing frames
(``FRAME_EXT``), which are sent with ``copy=False``. Decoded arrays are read-only, like the
frozen messages that hold them. Only plain numeric dtypes are accepted, and
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
VECTOR_EXT = 3
MAX_NDIM = 8
MAX_ARRAY_FRAMES = 64
ALLOWED_DTYPES = ("|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8")
# Precomputed per dtype and per rank: arrays ride on hot messages (token chunks), so the header
# must cost a dict lookup and one struct call, not string formatting.
_HEADER_PREFIX = {np.dtype(name): bytes([len(name)]) + name.encode() for name in ALLOWED_DTYPES}
_VECTOR_PREFIX = {np.dtype(name): bytes([code]) for code, name in enumerate(ALLOWED_DTYPES)}
_DTYPE_BY_CODE = [np.dtype(name) for name in ALLOWED_DTYPES]
_DTYPE_BY_NAME = {name.encode(): np.dtype(name) for name in ALLOWED_DTYPES}
_RANK_AND_DIMS = [struct.Struct(f"<B{ndim}Q") for ndim in range(MAX_NDIM + 1)]
_DIMS = [struct.Struct(f"<{ndim}Q") for ndim in range(MAX_NDIM + 1)]
_U32 = struct.Struct("<I")

Buffer = bytes | memoryview


def as_numpy(obj: Any) -> np.ndarray:
    """A C-contiguous little-endian numpy array of `obj` (numpy array or CPU torch tensor)."""
    if type(obj) is np.ndarray and obj.dtype in _HEADER_PREFIX and obj.flags.c_contiguous:
        return obj
    if not isinstance(obj, np.ndarray):
        if type(obj).__module__.split(".", 1)[0] != "torch":
            raise TypeError(f"cannot encode {type(obj).__name__} on the bus")
        obj = obj.detach().cpu().contiguous().numpy()
    arr = np.ascontiguousarray(obj)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.dtype not in _HEADER_PREFIX:
        raise TypeError(f"array dtype {arr.dtype} cannot travel on the bus; use one of {list(ALLOWED_DTYPES)}")
    return arr


def _header(arr: np.ndarray) -> bytes:
    ndim = arr.ndim
    return _HEADER_PREFIX[arr.dtype] + _RANK_AND_DIMS[ndim].pack(ndim, *arr.shape)


def encode_array(obj: Any, frames: list[Buffer], threshold_bytes: int) -> msgspec.msgpack.Ext:
    """The extension value of one array; large arrays append their buffer to `frames`."""
    arr = as_numpy(obj)
    if arr.nbytes < threshold_bytes or len(frames) >= MAX_ARRAY_FRAMES:
        if arr.ndim == 1:  # the common case (token ids, logprobs): a one-byte header
            return msgspec.msgpack.Ext(VECTOR_EXT, _VECTOR_PREFIX[arr.dtype] + arr.tobytes())
        return msgspec.msgpack.Ext(INLINE_EXT, _header(arr) + arr.tobytes())
    frames.append(memoryview(arr.data).cast("B"))
    return msgspec.msgpack.Ext(FRAME_EXT, _header(arr) + _U32.pack(len(frames) - 1))


def _malformed(detail: str) -> DecodeError:
    return DecodeError(DropReason.MALFORMED, f"array: {detail}")


def _read_header(data: memoryview) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """dtype, shape and the offset just past the header; raises DecodeError on any inconsistency."""
    size = len(data)
    if size < 2:
        raise _malformed("header too short")
    end = 1 + data[0]
    dtype = _DTYPE_BY_NAME.get(bytes(data[1:end]))
    if dtype is None:
        raise _malformed(f"dtype {bytes(data[1:end])[:16]!r} not allowed")
    if size < end + 1:
        raise _malformed("header too short")
    ndim = data[end]
    if ndim > MAX_NDIM:
        raise _malformed(f"{ndim} dimensions (at most {MAX_NDIM})")
    dims_end = end + 1 + 8 * ndim
    if size < dims_end:
        raise _malformed("header too short for its dimensions")
    return dtype, _DIMS[ndim].unpack_from(data, end + 1), dims_end


def _checked_array(raw: Buffer, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    num_items = 1
    for dim in shape:
        num_items *= dim
    if num_items * dtype.itemsize != len(raw) - offset:
        raise _malformed(f"shape {shape} of {dtype} needs {num_items * dtype.itemsize} bytes, got {len(raw) - offset}")
    arr = np.frombuffer(raw, dtype=dtype, offset=offset)
    return arr if len(shape) == 1 else arr.reshape(shape)


def decode_vector(data: memoryview) -> np.ndarray:
    """A 1-D inline array: u8 dtype code, then the items."""
    if not data or data[0] >= len(_DTYPE_BY_CODE):
        raise _malformed("bad vector dtype code")
    dtype = _DTYPE_BY_CODE[data[0]]
    if (len(data) - 1) % dtype.itemsize:
        raise _malformed(f"{len(data) - 1} bytes is not a whole number of {dtype} items")
    # msgspec's view is only valid during the hook: copy the (small) data out.
    return np.frombuffer(bytes(data[1:]), dtype=dtype)


def decode_array(code: int, data: memoryview, frames: Sequence[Buffer], used: list[int]) -> np.ndarray:
    """Rebuild an array from its extension value; `used` collects the frame indices referenced."""
    if code == VECTOR_EXT:
        return decode_vector(data)
    dtype, shape, offset = _read_header(data)
    if code == INLINE_EXT:
        return _checked_array(bytes(data[offset:]), 0, dtype, shape)
    if code == FRAME_EXT:
        if len(data) != offset + 4:
            raise _malformed("frame reference has trailing bytes")
        index = _U32.unpack_from(data, offset)[0]
        if index >= len(frames):
            raise _malformed(f"refers to frame {index} of {len(frames)}")
        used.append(index)
        return _checked_array(frames[index], 0, dtype, shape)
    raise _malformed(f"unknown extension code {code}")
