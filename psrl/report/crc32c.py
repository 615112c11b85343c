"""CRC32C (Castagnoli), the checksum TFRecord framing uses, and its "masked" form.

Pure Python and table driven: metric records are a few hundred bytes, so speed does not matter
here and no compiled package is needed.
"""

from __future__ import annotations

_POLYNOMIAL = 0x82F63B78  # reflected Castagnoli polynomial
_MASK_DELTA = 0xA282EAD8
_UINT32 = 0xFFFFFFFF


def _make_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLYNOMIAL if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _make_table()


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """The CRC32C of ``data`` (``crc32c(b"123456789") == 0xE3069283``)."""
    crc = _UINT32
    table = _TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ _UINT32


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The masked CRC TFRecord stores: a CRC of data that itself holds CRCs stays distinguishable."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _UINT32
