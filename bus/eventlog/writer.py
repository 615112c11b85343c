"""Appending events to segment files, with rotation by size and a configurable fsync policy.

fsync policies (``run.fsync``):

* ``never``: the operating system decides when data reaches the disk (fastest; a machine crash
  can lose the last seconds, a process crash loses only what `flush` had not handed over).
* ``segment``: a segment is fsynced when it is closed (rotation, shutdown).
* ``always``: every record is flushed and fsynced before `append` returns (slow; for debugging
  runs that die hard).

A writer never appends to an existing segment, whose tail may be torn: it starts the segment
after the highest one present, so a restarted logger continues the same log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal

from bus.errors import BusError
from bus.eventlog.format import HEADER, encode_header, encode_record, newest_segment, segment_path
from bus.schema import PROTOCOL_VERSION

FsyncPolicy = Literal["never", "segment", "always"]
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
_WRITE_BUFFER_BYTES = 1 << 20


class EventLogWriter:
    """Appends records to ``<directory>/<index>.seg`` files. One thread only."""

    def __init__(
        self, directory: str | Path, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES, fsync: FsyncPolicy = "segment"
    ) -> None:
        if fsync not in ("never", "segment", "always"):
            raise BusError(f"unknown fsync policy {fsync!r}; use never, segment or always")
        if segment_bytes < 1024:
            raise BusError(f"segment size {segment_bytes} is too small (at least 1024 bytes)")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.num_records = 0
        self.num_bytes = 0
        self.segment = newest_segment(self.directory)
        self._file: BinaryIO | None = None
        self._segment_size = 0
        self._open_next()

    def append(self, frames: Sequence[Any]) -> None:
        """Write one event's frames as a record (rotating first if the segment is full)."""
        if self._file is None:
            raise BusError("event log writer is closed")
        record = encode_record(frames)
        if self._segment_size + len(record) > self.segment_bytes and self._segment_size > HEADER.size:
            self._close_segment()
            self._open_next()
        file = self._require_file()
        file.write(record)
        self._segment_size += len(record)
        self.num_records += 1
        self.num_bytes += len(record)
        if self.fsync == "always":
            file.flush()
            os.fsync(file.fileno())

    def flush(self) -> None:
        """Hand buffered records to the operating system (readers of a live log then see them)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._close_segment()

    def _require_file(self) -> BinaryIO:
        if self._file is None:
            raise BusError("event log writer is closed")
        return self._file

    def _open_next(self) -> None:
        self.segment += 1
        path = segment_path(self.directory, self.segment)
        self._file = open(path, "xb", buffering=_WRITE_BUFFER_BYTES)  # noqa: SIM115 (kept open across appends)
        self._file.write(encode_header(*PROTOCOL_VERSION, self.segment, time.time_ns()))
        self._segment_size = HEADER.size
        if self.fsync != "never":
            self._fsync_directory()

    def _close_segment(self) -> None:
        file = self._require_file()
        file.flush()
        if self.fsync != "never":
            os.fsync(file.fileno())
        file.close()
        self._file = None

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
