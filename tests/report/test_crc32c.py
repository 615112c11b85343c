from hypothesis import given
from hypothesis import strategies as st

from psrl.report.crc32c import crc32c, masked_crc32c


def bitwise_crc32c(data: bytes) -> int:
    """Independent reference: the Castagnoli CRC one bit at a time, no table."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_rfc3720_vectors() -> None:
    # iSCSI (RFC 3720, B.4) test vectors for CRC32C.
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C


@given(st.binary(max_size=300))
def test_table_matches_bitwise(data: bytes) -> None:
    assert crc32c(data) == bitwise_crc32c(data)


@given(st.binary(max_size=64))
def test_mask_is_the_tfrecord_rotation(data: bytes) -> None:
    crc = bitwise_crc32c(data)
    rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    assert masked_crc32c(data) == (rotated + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc32c(memoryview(data)) == masked_crc32c(bytearray(data))
