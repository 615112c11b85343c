"""Plain-data form of messages: for JSON output and for comparing decisions in replay."""

from __future__ import annotations

import dataclasses
from enum import Enum, IntEnum
from typing import Any

import msgspec
import numpy as np


def to_builtins(value: Any) -> Any:
    """JSON-ready form: structs as objects with field names, arrays as lists, enums by name."""
    if isinstance(value, msgspec.Struct):
        return {name: to_builtins(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, IntEnum):
        return value.name.lower()
    if isinstance(value, list | tuple):
        return [to_builtins(v) for v in value]
    if isinstance(value, dict):
        return {k: to_builtins(v) for k, v in value.items()}
    return value


def same_value(a: Any, b: Any) -> bool:
    """Equality that also works for messages holding numpy arrays (compared by dtype-free values)."""
    return bool(type(a) is type(b) and to_builtins(a) == to_builtins(b))


def readable(value: Any) -> Any:
    """Like `to_builtins`, for people: nested msgpack records (bytes fields such as a routing decision's
    record) are decoded, dataclasses become objects and enums their names; undecodable bytes are
    shown by size. For display only (never for comparing decisions)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return _nested(bytes(value))
    if isinstance(value, msgspec.Struct):
        return {name: readable(getattr(value, name)) for name in value.__struct_fields__}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: readable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.name.lower()
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [readable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((readable(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): readable(v) for k, v in value.items()}
    return value


def _nested(data: bytes) -> Any:
    try:
        return readable(msgspec.msgpack.decode(data))
    except msgspec.DecodeError:
        return f"<{len(data)} bytes>"
