"""The bus settings of a run: its ``bus`` section (and ``run.fsync``) in the form the bus takes them."""

from __future__ import annotations

from bus.security import CurveKeys
from bus.settings import BusSettings
from bus.sockets import SocketOptions
from psrl.config.root import Config

_MIB = 1024 * 1024


def bus_settings(config: Config, curve: CurveKeys | None = None) -> BusSettings:
    """Settings of ``config``; ``curve`` is given by the launcher when the run spans hosts."""
    bus = config.bus
    max_message_bytes = bus.max_message_mib * _MIB
    # no frame of a message the codec accepts is larger than the message: cut larger ones at the socket
    options = SocketOptions(hwm=bus.hwm, curve=curve, max_frame_bytes=max_message_bytes)
    return BusSettings(
        options=options,
        array_frame_bytes=bus.array_frame_bytes,
        max_message_bytes=max_message_bytes,
        segment_bytes=bus.log_segment_mib * _MIB,
        fsync=config.run.fsync,
    )
