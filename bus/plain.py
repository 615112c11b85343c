"""Plain-data form of messages: for JSON output and for comparing decisions in replay."""

from __future__ import annotations

from enum import IntEnum
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
