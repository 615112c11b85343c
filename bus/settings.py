"""Bus settings in the form the bus classes take them (``psrl.config.bus_settings`` builds them from a run's config)."""

from __future__ import annotations

from dataclasses import dataclass

from bus.eventlog.writer import FsyncPolicy
from bus.sockets import SocketOptions


@dataclass(frozen=True)
class BusSettings:
    options: SocketOptions
    array_frame_bytes: int
    max_message_bytes: int
    segment_bytes: int
    fsync: FsyncPolicy
