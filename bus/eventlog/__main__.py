"""``python -m bus.eventlog RUN_DIR``: log a running run's bus to RUN_DIR/events in its own process."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

import zmq

from bus.addresses import BusAddresses
from bus.eventlog.logger import EventLogger
from bus.eventlog.writer import DEFAULT_SEGMENT_BYTES
from bus.security import load_keys
from bus.sockets import SocketOptions


def main(argv: list[str] | None = None) -> None:
    """Log a running run's bus to RUN_DIR/events until SIGTERM or SIGINT (addresses from RUN_DIR/bus.json)."""
    parser = argparse.ArgumentParser(prog="python -m bus.eventlog", description=main.__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--fsync", choices=["never", "segment", "always"], default="segment")
    parser.add_argument("--segment-mib", type=int, default=DEFAULT_SEGMENT_BYTES >> 20)
    args = parser.parse_args(argv)
    addresses = BusAddresses.load(args.run_dir)
    curve = load_keys(addresses.curve_dir) if addresses.curve_dir else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ctx = zmq.Context()
    logger = EventLogger(
        ctx,
        addresses,
        args.run_dir / "events",
        options=SocketOptions(curve=curve),
        segment_bytes=args.segment_mib << 20,
        fsync=args.fsync,
    )
    logger.run(stop)
    ctx.term()
    print(
        f"logged {logger.writer.num_records} messages ({logger.writer.num_bytes} bytes); "
        f"dropped {logger.drops.total} malformed; {logger.gaps.num_missing} events never arrived",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
