"""Bus settings resolved from a run's configuration, in the form the bus classes take them."""

from __future__ import annotations

from dataclasses import dataclass

from bus.eventlog.writer import FsyncPolicy
from bus.security import CurveKeys
from bus.sockets import SocketOptions
from psrl.config import Config

_MIB = 1024 * 1024


@dataclass(frozen=True)
class BusSettings:
    options: SocketOptions
    array_frame_bytes: int
    max_message_bytes: int
    segment_bytes: int
    fsync: FsyncPolicy
    request_timeout_ms: int
    request_retries: int

    @classmethod
    def from_config(cls, config: Config, curve: CurveKeys | None = None) -> BusSettings:
        """Settings of `config`; `curve` is given by the launcher when the run spans hosts."""
        bus = config.bus
        return cls(
            options=SocketOptions(hwm=bus.hwm, curve=curve),
            array_frame_bytes=bus.array_frame_bytes,
            max_message_bytes=bus.max_message_mib * _MIB,
            segment_bytes=bus.log_segment_mib * _MIB,
            fsync=config.run.fsync,
            request_timeout_ms=bus.request_timeout_ms,
            request_retries=bus.request_retries,
        )
