"""On-disk layout of event-log segments.

A segment is ``<events_dir>/<index:08d>.seg``: a 24-byte header, then records::

    header  = magic "PSRLLOG1" | u16 protocol major | u16 protocol minor | u32 segment index | u64 created (unix ns)
    record  = u32 payload length | u32 crc32(payload) | payload
    payload = u16 number of frames | that many u32 frame lengths | the frames, back to back

The frames are the event's ZeroMQ frames exactly as received (kind, body, array frames), so the
writer never re-encodes and a reader decodes records with the same codec as a live subscriber.
All integers are little-endian. A record is valid only if its whole payload is present and its
checksum matches; the first invalid record ends what a reader accepts from that segment.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAGIC = b"PSRLLOG1"
HEADER = struct.Struct("<8sHHIQ")
RECORD_HEADER = struct.Struct("<II")
SEGMENT_SUFFIX = ".seg"
MAX_RECORD_BYTES = 1 << 30  # larger lengths can only come from corruption
_FRAME_COUNT = struct.Struct("<H")


def segment_path(directory: Path, index: int) -> Path:
    return directory / f"{index:08d}{SEGMENT_SUFFIX}"


def segment_index(path: Path) -> int | None:
    """The index of a segment file name, or None for other files."""
    if path.suffix != SEGMENT_SUFFIX or not path.stem.isdigit():
        return None
    return int(path.stem)


def newest_segment(directory: Path) -> int:
    """The index of the newest segment in ``directory`` (0 when there is none): a writer starts the next."""
    if not directory.is_dir():
        return 0
    return max((i for p in directory.iterdir() if (i := segment_index(p)) is not None), default=0)


def encode_header(major: int, minor: int, index: int, created_ns: int) -> bytes:
    return HEADER.pack(MAGIC, major, minor, index, created_ns)


def encode_record(frames: Sequence[Any]) -> bytes:
    """One framed, checksummed record of an event's frames (bytes, buffers or zmq.Frames)."""
    num_frames = len(frames)
    counts = _COUNT_AND_LENGTHS[num_frames] if num_frames < len(_COUNT_AND_LENGTHS) else _count_and_lengths(num_frames)
    payload = b"".join((counts.pack(num_frames, *[len(f) for f in frames]), *frames))
    return RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _count_and_lengths(num_frames: int) -> struct.Struct:
    return struct.Struct(f"<H{num_frames}I")


_COUNT_AND_LENGTHS = [_count_and_lengths(n) for n in range(8)]


def decode_payload(payload: memoryview) -> list[memoryview]:
    """Split a checksummed payload into frames; raises ValueError if its counts are inconsistent."""
    if len(payload) < _FRAME_COUNT.size:
        raise ValueError("payload shorter than its frame count")
    (num_frames,) = _FRAME_COUNT.unpack_from(payload)
    offset = _FRAME_COUNT.size + 4 * num_frames
    if len(payload) < offset:
        raise ValueError(f"payload too short for {num_frames} frame lengths")
    lengths = struct.unpack_from(f"<{num_frames}I", payload, _FRAME_COUNT.size)
    if offset + sum(lengths) != len(payload):
        raise ValueError(f"frame lengths sum to {sum(lengths)}, payload holds {len(payload) - offset}")
    frames = []
    for length in lengths:
        frames.append(payload[offset : offset + length])
        offset += length
    return frames
