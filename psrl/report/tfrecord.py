"""TFRecord framing, the container of TensorBoard event files.

Each record is::

    uint64 length (little endian)
    uint32 masked CRC32C of the 8 length bytes
    bytes  data[length]
    uint32 masked CRC32C of the data
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

from psrl.report.crc32c import masked_crc32c

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_BYTES = _LENGTH.size + _CRC.size
FOOTER_BYTES = _CRC.size


class RecordError(ValueError):
    """A record that cannot be read: torn (file ends inside it) or corrupt (a CRC does not match)."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"record at byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def frame_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord."""
    length = _LENGTH.pack(len(data))
    return length + _CRC.pack(masked_crc32c(length)) + data + _CRC.pack(masked_crc32c(data))


def read_records(stream: BinaryIO) -> Iterator[bytes]:
    """The data of every record in ``stream``; raises `RecordError` at the first torn or corrupt one."""
    offset = 0
    while True:
        header = stream.read(HEADER_BYTES)
        if not header:
            return
        if len(header) < HEADER_BYTES:
            raise RecordError(offset, f"torn header ({len(header)} of {HEADER_BYTES} bytes)")
        length_bytes = header[: _LENGTH.size]
        (expected,) = _CRC.unpack(header[_LENGTH.size :])
        if masked_crc32c(length_bytes) != expected:
            raise RecordError(offset, "length CRC mismatch")
        (length,) = _LENGTH.unpack(length_bytes)
        body = stream.read(length + FOOTER_BYTES)
        if len(body) < length + FOOTER_BYTES:
            raise RecordError(offset, f"torn record ({len(body)} of {length + FOOTER_BYTES} bytes after the header)")
        data = body[:length]
        (data_crc,) = _CRC.unpack(body[length:])
        if masked_crc32c(data) != data_crc:
            raise RecordError(offset, "data CRC mismatch")
        yield data
        offset += HEADER_BYTES + length + FOOTER_BYTES
