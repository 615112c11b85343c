"""TensorBoard event files written and read without the tensorboard package.

A file is a TFRecord stream of Event protos: first one with ``file_version = "brain.Event:2"``,
then one per `add_scalars` call. TensorBoard finds every file whose name contains ``tfevents``
under the directory it is pointed at; each sub-directory shows as one run.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from psrl.report.tb_proto import TbEvent, decode_event, encode_event
from psrl.report.tfrecord import frame_record, read_records

FILE_VERSION = "brain.Event:2"
_FILE_COUNTER = itertools.count()


@dataclass(frozen=True)
class ScalarPoint:
    step: int
    value: float
    wall_time: float


def event_file_name(wall_time: float) -> str:
    """TensorBoard's naming: ``events.out.tfevents.<seconds>.<host>.<pid>.<n>`` (unique per writer)."""
    host = socket.gethostname().replace("/", "_") or "host"
    return f"events.out.tfevents.{int(wall_time):010d}.{host}.{os.getpid()}.{next(_FILE_COUNTER)}"


class TensorBoardWriter:
    """Appends scalar events to one new event file in ``directory`` (created if missing)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        started = time.time()
        self.path = self.directory / event_file_name(started)
        self._file = self.path.open("xb")
        self._write(encode_event(started, 0, file_version=FILE_VERSION))

    def add_scalars(self, step: int, values: Mapping[str, float], wall_time: float | None = None) -> None:
        """One event holding every value of ``values`` at ``step``; flushed so TensorBoard sees it at once."""
        if not values:
            return
        self._write(encode_event(time.time() if wall_time is None else wall_time, step, scalars=values))

    def _write(self, event: bytes) -> None:
        self._file.write(frame_record(event))
        self._file.flush()

    @property
    def is_closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def read_event_file(path: str | Path) -> list[TbEvent]:
    """Every event of one file; raises `RecordError` or `ProtoError` on a damaged file."""
    with Path(path).open("rb") as stream:
        return [decode_event(record) for record in read_records(stream)]


def event_files(directory: str | Path) -> list[Path]:
    """Event files directly in ``directory``, oldest first (the name starts with the creation time)."""
    return sorted(p for p in Path(directory).iterdir() if p.is_file() and "tfevents" in p.name)


def read_scalars(directory: str | Path) -> dict[str, list[ScalarPoint]]:
    """tag -> its points, from every event file directly in ``directory``."""
    series: dict[str, list[ScalarPoint]] = {}
    for path in event_files(directory):
        for event in read_event_file(path):
            for tag, value in event.scalars:
                series.setdefault(tag, []).append(ScalarPoint(event.step, value, event.wall_time))
    return series
