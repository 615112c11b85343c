"""An event logger process for tests: logs the bus whose addresses are in RUN_DIR/bus.json until killed.

Run as ``python logger_proc.py RUN_DIR EVENTS_DIR``; prints ``ready`` once subscribed. It stops by
itself after about a minute so a failed test cannot leave it running.
"""

from __future__ import annotations

import sys
import time

import zmq

from bus.addresses import BusAddresses
from bus.eventlog import EventLogger


def main(run_dir: str, events_dir: str) -> None:
    ctx = zmq.Context()
    logger = EventLogger(ctx, BusAddresses.load(run_dir), events_dir, flush_interval_s=0.05)
    logger.start()
    print("ready", flush=True)
    time.sleep(60)
    logger.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
