import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psrl.report.tb_proto import ProtoError, decode_event, encode_event, encode_varint, iter_fields


def test_varints() -> None:
    assert encode_varint(0) == b"\x00"
    assert encode_varint(1) == b"\x01"
    assert encode_varint(300) == b"\xac\x02"
    assert encode_varint(-1) == b"\xff" * 9 + b"\x01"


def test_scalar_event_bytes_follow_the_proto() -> None:
    encoded = encode_event(1.5, 2, scalars={"a": 1.0})
    value = b"\x0a\x01a" + b"\x15" + struct.pack("<f", 1.0)  # tag = 1 (string), simple_value = 2 (float)
    summary = b"\x0a" + bytes([len(value)]) + value  # repeated Value value = 1
    expected = b"\x09" + struct.pack("<d", 1.5) + b"\x10\x02" + b"\x2a" + bytes([len(summary)]) + summary
    assert encoded == expected


def test_file_version_event() -> None:
    encoded = encode_event(10.0, 0, file_version="brain.Event:2")
    assert encoded.endswith(b"\x1a\x0dbrain.Event:2")
    event = decode_event(encoded)
    assert event.file_version == "brain.Event:2"
    assert event.scalars == []


finite_floats = st.floats(allow_nan=False, width=32)


@given(
    st.floats(min_value=0, max_value=4e9),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.dictionaries(st.text(min_size=1, max_size=20), finite_floats, max_size=6),
)
def test_round_trip(wall_time: float, step: int, scalars: dict[str, float]) -> None:
    event = decode_event(encode_event(wall_time, step, scalars=scalars))
    assert event.wall_time == wall_time
    assert event.step == step
    assert dict(event.scalars) == scalars


def test_values_are_float32() -> None:
    event = decode_event(encode_event(0.0, 1, scalars={"x": 0.1, "big": 1e300, "nan": math.nan}))
    values = dict(event.scalars)
    assert values["x"] == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert values["big"] == math.inf
    assert math.isnan(values["nan"])


def test_unknown_fields_are_skipped() -> None:
    extra = b"\x20\x07" + b"\x3a\x03xyz"  # field 4 varint, field 7 bytes
    event = decode_event(extra + encode_event(3.0, 4, scalars={"k": 2.0}))
    assert event.step == 4
    assert event.scalars == [("k", 2.0)]


@pytest.mark.parametrize("bad", [b"\x10", b"\x2a\x05ab", b"\x0b", b"\x10" + b"\xff" * 11])
def test_malformed_messages_raise(bad: bytes) -> None:
    with pytest.raises(ProtoError):
        list(iter_fields(bad))
