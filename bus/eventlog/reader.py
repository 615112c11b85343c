"""Reading an event log: every whole record up to the first torn or corrupt one of each segment.

A reader never stops at a bad record silently: each one becomes a `LogProblem` naming the
segment, the byte offset and the reason, and everything before it is kept. A segment still
being written ends in a partial record while the logger is mid-write; that shows up as a torn
tail too, and is gone once the writer flushes.
"""

from __future__ import annotations

import collections
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus.codec import DEFAULT_MAX_MESSAGE_BYTES, Decoder
from bus.errors import DecodeError
from bus.eventlog.format import HEADER, MAGIC, MAX_RECORD_BYTES, RECORD_HEADER, decode_payload, segment_index
from bus.schema import PROTOCOL_VERSION, Event


@dataclass(frozen=True)
class LogRecord:
    segment: Path
    offset: int
    frames: list[memoryview]


@dataclass(frozen=True)
class LoggedEvent:
    segment: Path
    offset: int
    event: Event[Any]


@dataclass(frozen=True)
class LogProblem:
    """A part of the log that could not be read; `num_bytes_skipped` bytes from `offset` on are lost."""

    segment: str
    offset: int
    reason: str
    num_bytes_skipped: int

    def describe(self) -> str:
        return f"{self.segment} @ byte {self.offset}: {self.reason} ({self.num_bytes_skipped} bytes skipped)"


class EventLogReader:
    """Iterates the records (or decoded events) of ``<run_dir>/events`` in segment order."""

    def __init__(
        self,
        directory: str | Path,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        decoder: Decoder | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.problems: list[LogProblem] = []
        self._decoder = decoder or Decoder(max_message_bytes)

    def segments(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        indexed = [(i, p) for p in self.directory.iterdir() if (i := segment_index(p)) is not None]
        return [p for _, p in sorted(indexed)]

    def records(self) -> Iterator[LogRecord]:
        for path in self.segments():
            yield from self._segment_records(path)

    def events(self) -> Iterator[LoggedEvent]:
        """Decoded events (upgraded to current schemas); undecodable records become problems."""
        for record in self.records():
            yield from self._decoded(record)

    def _decoded(self, record: LogRecord) -> Iterator[LoggedEvent]:
        try:
            events = self._decoder.decode(record.frames)
        except DecodeError as error:
            size = sum(len(f) for f in record.frames)
            self.problems.append(LogProblem(str(record.segment), record.offset, f"undecodable event: {error}", size))
            return
        for event in events:  # a record holds one message, which may be a batch of events
            yield LoggedEvent(record.segment, record.offset, event)

    def events_of(self, kinds: set[str], first_segment: int = 0) -> Iterator[LoggedEvent]:
        """Decoded events of ``kinds`` only, from segment ``first_segment`` on; the others are not decoded
        (their topic frame says their kind)."""
        topics = {kind.encode() for kind in kinds}
        for path in self.segments():
            if (segment_index(path) or 0) < first_segment:
                continue
            for record in self._segment_records(path):
                if record.frames and bytes(record.frames[0]) in topics:
                    yield from self._decoded(record)

    def last_record(self) -> LogRecord | None:
        """The last whole record of the log (reading back from the newest non-empty segment)."""
        for path in reversed(self.segments()):
            records = collections.deque(self._segment_records(path), maxlen=1)
            if records:
                return records[0]
        return None

    def _segment_records(self, path: Path) -> Iterator[LogRecord]:
        data = memoryview(path.read_bytes())
        problem = _header_problem(data)
        if problem is not None:
            self._report(path, 0, problem, len(data))
            return
        offset = HEADER.size
        while offset < len(data):
            reason = _record_problem(data, offset)
            if reason is not None:
                self._report(path, offset, reason, len(data) - offset)
                return
            length, _ = RECORD_HEADER.unpack_from(data, offset)
            start = offset + RECORD_HEADER.size
            try:
                frames = decode_payload(data[start : start + length])
            except ValueError as exc:
                self._report(path, offset, f"malformed record: {exc}", RECORD_HEADER.size + length)
            else:
                yield LogRecord(path, offset, frames)
            offset = start + length

    def _report(self, path: Path, offset: int, reason: str, num_bytes: int) -> None:
        self.problems.append(LogProblem(str(path), offset, reason, num_bytes))


def _header_problem(data: memoryview) -> str | None:
    if len(data) < HEADER.size:
        return f"truncated segment header ({len(data)} of {HEADER.size} bytes)"
    magic, major, minor, _, _ = HEADER.unpack_from(data)
    if magic != MAGIC:
        return "not a psrl event-log segment (bad magic)"
    if major > PROTOCOL_VERSION[0]:
        return f"written with protocol {major}.{minor}, newer than this reader's {PROTOCOL_VERSION[0]}.x"
    return None


def _record_problem(data: memoryview, offset: int) -> str | None:
    remaining = len(data) - offset
    if remaining < RECORD_HEADER.size:
        return f"torn tail: record header cut after {remaining} of {RECORD_HEADER.size} bytes"
    length, checksum = RECORD_HEADER.unpack_from(data, offset)
    if length > MAX_RECORD_BYTES:
        return f"corrupt record header: length {length}"
    available = remaining - RECORD_HEADER.size
    if available < length:
        return f"torn tail: record of {length} bytes cut after {available}"
    start = offset + RECORD_HEADER.size
    if zlib.crc32(data[start : start + length]) != checksum:
        return "checksum mismatch"
    return None
