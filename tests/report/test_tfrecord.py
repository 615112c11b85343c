import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psrl.report.crc32c import masked_crc32c
from psrl.report.tfrecord import HEADER_BYTES, RecordError, frame_record, read_records


def test_frame_layout() -> None:
    framed = frame_record(b"abc")
    length = struct.pack("<Q", 3)
    assert framed[:8] == length
    assert struct.unpack("<I", framed[8:12])[0] == masked_crc32c(length)
    assert framed[12:15] == b"abc"
    assert struct.unpack("<I", framed[15:])[0] == masked_crc32c(b"abc")
    assert len(framed) == HEADER_BYTES + 3 + 4


@given(st.lists(st.binary(max_size=200), max_size=8))
def test_round_trip(records: list[bytes]) -> None:
    stream = io.BytesIO(b"".join(frame_record(r) for r in records))
    assert list(read_records(stream)) == records


def two_records() -> bytes:
    return frame_record(b"first record") + frame_record(b"second record")


def test_flipped_data_byte_is_reported_after_good_records() -> None:
    data = bytearray(two_records())
    second = len(frame_record(b"first record"))
    data[second + HEADER_BYTES + 2] ^= 0x01
    reader = read_records(io.BytesIO(bytes(data)))
    assert next(reader) == b"first record"
    with pytest.raises(RecordError, match="data CRC") as caught:
        next(reader)
    assert caught.value.offset == second


def test_flipped_length_byte_is_reported() -> None:
    data = bytearray(two_records())
    data[0] ^= 0x04
    with pytest.raises(RecordError, match="length CRC"):
        list(read_records(io.BytesIO(bytes(data))))


@pytest.mark.parametrize("cut", [1, HEADER_BYTES - 1, HEADER_BYTES + 1, 3])
def test_torn_tail(cut: int) -> None:
    data = two_records()
    torn = data[: len(frame_record(b"first record")) + cut]
    reader = read_records(io.BytesIO(torn))
    assert next(reader) == b"first record"
    with pytest.raises(RecordError, match="torn"):
        next(reader)
