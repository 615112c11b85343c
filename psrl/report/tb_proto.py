"""Hand-encoded protobuf for the two TensorBoard messages a scalar event file needs.

Only these fields are written (numbers from tensorflow/core/util/event.proto and summary.proto)::

    Event         { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary       { repeated Value value = 1; }
    Summary.Value { string tag = 1; float simple_value = 2; }

The decoder reads those fields back and skips any other field, as protobuf readers do.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_UINT64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")

EVENT_WALL_TIME, EVENT_STEP, EVENT_FILE_VERSION, EVENT_SUMMARY = 1, 2, 3, 5
SUMMARY_VALUE = 1
VALUE_TAG, VALUE_SIMPLE_VALUE = 1, 2


class ProtoError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


@dataclass(frozen=True)
class TbEvent:
    """One decoded event: its time, step and either a file version or scalar values."""

    wall_time: float
    step: int
    file_version: str | None = None
    scalars: list[tuple[str, float]] = field(default_factory=list)


def encode_varint(value: int) -> bytes:
    """Base-128 varint; negative numbers are written as their 64-bit two's complement (10 bytes)."""
    value &= _UINT64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return encode_varint((number << 3) | wire_type)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _key(number, _LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def encode_scalar_value(tag: str, value: float) -> bytes:
    """A Summary.Value with a simple_value (stored as float32, as TensorBoard does)."""
    return _length_delimited(VALUE_TAG, tag.encode("utf-8")) + _key(VALUE_SIMPLE_VALUE, _FIXED32) + _FLOAT.pack(value)


def _float32(value: float) -> float:
    """``value`` as the nearest float32; out-of-range magnitudes become infinities instead of raising."""
    try:
        return float(_FLOAT.unpack(_FLOAT.pack(value))[0])
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def encode_event(wall_time: float, step: int, *, file_version: str | None = None,
                 scalars: Mapping[str, float] | None = None) -> bytes:  # fmt: skip
    """An Event carrying either a file version (the first record of a file) or scalar values."""
    out = _key(EVENT_WALL_TIME, _FIXED64) + _DOUBLE.pack(wall_time) + _key(EVENT_STEP, _VARINT) + encode_varint(step)
    if file_version is not None:
        out += _length_delimited(EVENT_FILE_VERSION, file_version.encode("utf-8"))
    if scalars:
        summary = b"".join(
            _length_delimited(SUMMARY_VALUE, encode_scalar_value(tag, _float32(value)))
            for tag, value in scalars.items()
        )
        out += _length_delimited(EVENT_SUMMARY, summary)
    return out


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _UINT64, pos
        shift += 7
        if shift >= 70:
            raise ProtoError("varint longer than 10 bytes")
    raise ProtoError("message ends inside a varint")


def iter_fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field; varints as int, everything else as raw bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, pos = _read_varint(data, pos)
            yield number, wire_type, value
            continue
        if wire_type == _LENGTH_DELIMITED:
            size, pos = _read_varint(data, pos)
        elif wire_type in (_FIXED64, _FIXED32):
            size = 8 if wire_type == _FIXED64 else 4
        else:
            raise ProtoError(f"unsupported wire type {wire_type} for field {number}")
        if pos + size > len(data):
            raise ProtoError(f"field {number} runs past the end of the message")
        yield number, wire_type, data[pos : pos + size]
        pos += size


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _decode_value(data: bytes) -> tuple[str, float] | None:
    tag, value = None, None
    for number, wire_type, raw in iter_fields(data):
        if number == VALUE_TAG and isinstance(raw, bytes):
            tag = raw.decode("utf-8")
        elif number == VALUE_SIMPLE_VALUE and wire_type == _FIXED32 and isinstance(raw, bytes):
            value = float(_FLOAT.unpack(raw)[0])
    return (tag, value) if tag is not None and value is not None else None


def decode_event(data: bytes) -> TbEvent:
    """Read back what `encode_event` writes (other fields are skipped)."""
    wall_time, step, file_version = 0.0, 0, None
    scalars: list[tuple[str, float]] = []
    for number, wire_type, raw in iter_fields(data):
        if number == EVENT_WALL_TIME and wire_type == _FIXED64 and isinstance(raw, bytes):
            wall_time = float(_DOUBLE.unpack(raw)[0])
        elif number == EVENT_STEP and isinstance(raw, int):
            step = _signed64(raw)
        elif number == EVENT_FILE_VERSION and isinstance(raw, bytes):
            file_version = raw.decode("utf-8")
        elif number == EVENT_SUMMARY and isinstance(raw, bytes):
            for value_number, _, value_raw in iter_fields(raw):
                if value_number == SUMMARY_VALUE and isinstance(value_raw, bytes):
                    scalar = _decode_value(value_raw)
                    if scalar is not None:
                        scalars.append(scalar)
    return TbEvent(wall_time, step, file_version, scalars)
