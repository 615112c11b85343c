"""The run's event log: append-only, segmented, checksummed files under ``<run_dir>/events/``."""

from bus.eventlog.format import SEGMENT_SUFFIX, segment_path
from bus.eventlog.logger import EventLogger
from bus.eventlog.reader import EventLogReader, LoggedEvent, LogProblem, LogRecord
from bus.eventlog.writer import EventLogWriter, FsyncPolicy

__all__ = [
    "SEGMENT_SUFFIX",
    "EventLogReader",
    "EventLogWriter",
    "EventLogger",
    "FsyncPolicy",
    "LogProblem",
    "LogRecord",
    "LoggedEvent",
    "segment_path",
]
