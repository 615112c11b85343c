"""Hypothesis strategies for every message kind, derived from the struct definitions.

Deriving them from `msgspec.inspect` means a kind added to bus/messages.py is covered by the
round-trip tests without writing a strategy for it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bus.schema import Envelope, Message

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ARRAY_DTYPES = [np.int32, np.int64, np.float32, np.float64, np.uint8, np.bool_, np.int16]


def arrays() -> st.SearchStrategy[np.ndarray]:
    """Arrays from empty to a few KiB (both inline and trailing-frame sizes in the tests)."""
    return st.sampled_from(ARRAY_DTYPES).flatmap(
        lambda dtype: hnp.arrays(
            dtype,
            hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=24),
            elements=hnp.from_dtype(np.dtype(dtype), allow_nan=False),
        )
    )


def for_type(info: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(info, mi.IntType):
        return INT64
    if isinstance(info, mi.FloatType):
        return st.floats(allow_nan=False)
    if isinstance(info, mi.StrType):
        return st.text(max_size=16)
    if isinstance(info, mi.BytesType):
        return st.binary(max_size=64)
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.ListType):
        return st.lists(for_type(info.item_type), max_size=5)
    if isinstance(info, mi.DictType):
        return st.dictionaries(for_type(info.key_type), for_type(info.value_type), max_size=4)
    if isinstance(info, mi.EnumType):
        return st.sampled_from(list(info.cls))
    if isinstance(info, mi.UnionType):
        return st.one_of([for_type(t) for t in info.types])
    if isinstance(info, mi.StructType):
        return structs(info.cls)
    if isinstance(info, mi.CustomType) and info.cls is np.ndarray:
        return arrays()
    raise TypeError(f"no strategy for {info}")


def structs(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    info = mi.type_info(cls)
    if not isinstance(info, mi.StructType):
        raise TypeError(cls)
    return st.builds(cls, **{f.name: for_type(f.type) for f in info.fields})


def envelopes(cls: type[Message]) -> st.SearchStrategy[Envelope]:
    optional_int = st.none() | INT64
    sender = st.text(alphabet=st.characters(exclude_characters="#:", exclude_categories=["Cs"]), min_size=1)
    return st.builds(
        Envelope,
        kind=st.just(cls.KIND),
        schema_version=st.just(cls.SCHEMA_VERSION),
        sender=sender,
        incarnation=st.integers(0, 2**31),
        seq=st.integers(1, 2**63 - 1),
        mono_ns=st.integers(0, 2**63 - 1),
        wall_ns=st.integers(0, 2**63 - 1),
        parent=st.none() | st.text(max_size=40),
        model_version=optional_int,
        request_id=optional_int,
        prompt_id=optional_int,
    )


def assert_same(expected: Any, actual: Any, path: str = "message") -> None:
    """Deep equality that checks arrays by dtype, shape and values."""
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), path
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, path
        assert np.array_equal(actual, expected), path
    elif isinstance(expected, msgspec.Struct):
        assert type(actual) is type(expected), path
        for name in expected.__struct_fields__:
            assert_same(getattr(expected, name), getattr(actual, name), f"{path}.{name}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), path
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for key in expected:
            assert_same(expected[key], actual[key], f"{path}[{key!r}]")
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != {expected!r}"
