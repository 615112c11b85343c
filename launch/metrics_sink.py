"""Run metrics on disk: every `obs.metrics` event the launcher sees goes to ``<run>/metrics.jsonl``
and to TensorBoard event files under ``<run>/tb/<sender>/`` (one TensorBoard run per actor).

The sink is a launcher listener like `launch.progress.ProgressView`. A write failure (disk
full, directory removed) must not end the run: it is logged and counted in `num_write_errors`,
and the next event is tried again.
"""

from __future__ import annotations

import re
from typing import Any, TextIO

from bus.messages import Metrics
from bus.schema import Event
from psrl.log import get_logger
from psrl.report.metrics_file import MetricsRecord
from psrl.report.tensorboard import TensorBoardWriter
from psrl.rundir import RunDir

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_LOG_EVERY_N_ERRORS = 100


def tensorboard_run_name(sender: str) -> str:
    """A directory name for the sender's TensorBoard run (slashes and odd characters become '_')."""
    name = _UNSAFE_NAME.sub("_", sender).strip(".")
    return name or "unnamed"


class MetricsSink:
    """Appends every Metrics event to metrics.jsonl and to the sender's TensorBoard event file."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.log = get_logger("psrl.metrics_sink", run=run_dir.name)
        self.num_records = 0
        self.num_write_errors = 0
        self._writers: dict[str, TensorBoardWriter] = {}
        # Line buffered: each record reaches the file when written, so a killed launcher loses none.
        self._jsonl: TextIO | None = run_dir.metrics.open("a", encoding="utf-8", buffering=1)

    def on_event(self, event: Event[Any]) -> None:
        if not isinstance(event.message, Metrics):
            return
        if self._jsonl is None:
            self.log.warning("metrics event after close, not written", sender=event.envelope.sender)
            return
        record = MetricsRecord.from_event(event)
        try:
            self._jsonl.write(record.to_json_line())
            self._writer_for(record.sender).add_scalars(record.step, record.values, record.wall_time)
        except OSError as error:
            self._on_write_error(record, error)
            return
        self.num_records += 1

    def _writer_for(self, sender: str) -> TensorBoardWriter:
        writer = self._writers.get(sender)
        if writer is None:
            writer = TensorBoardWriter(self.run_dir.tensorboard / tensorboard_run_name(sender))
            self._writers[sender] = writer
        return writer

    def _on_write_error(self, record: MetricsRecord, error: OSError) -> None:
        self.num_write_errors += 1
        if self.num_write_errors % _LOG_EVERY_N_ERRORS == 1:
            self.log.error(
                "cannot write metrics", sender=record.sender, step=record.step, error=str(error),
                num_write_errors=self.num_write_errors,
            )  # fmt: skip

    def close(self) -> None:
        """Close every file; later events are logged and not written. Safe to call twice."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
