"""The logger actor: writes every event of the run to the event log in the run directory.

If the log cannot be written (a full disk), the actor dies (ActorDead, exit 1) within one loop
turn: the supervisor restarts it under its restart policy, and a logger that fails while the run
stops fails the run (launch.supervisor), so a truncated log is never reported as a finished run.
"""

from __future__ import annotations

from pathlib import Path

from actors.base import Actor
from actors.boot import Boot
from bus.eventlog.logger import EventLogger

WRITER_CHECK_S = 0.1


class LoggerActor(Actor):
    ROLE = "logger"

    def __init__(self, boot: Boot) -> None:
        super().__init__(boot)
        if boot.run_dir is None:
            raise ValueError("the logger runs on the launching host and needs the run directory")
        # Subscribe before Hello, so the log holds the logger's own lifecycle events too.
        self.event_logger = EventLogger(
            self.ctx,
            self.addresses,
            Path(boot.run_dir) / "events",
            options=self.bus.options,
            segment_bytes=self.bus.segment_bytes,
            fsync=self.bus.fsync,
        )
        self.event_logger.start()

    def setup(self) -> dict[str, int]:
        # a writer thread that died (a full disk) is fatal here, paused or not: heartbeating on
        # beside a log that stopped growing would let the run end "finished" with a truncated log
        self.every(WRITER_CHECK_S, self.event_logger.check)
        return {}

    def drop_counts(self) -> dict[str, int]:
        counts = super().drop_counts()
        drops = self.event_logger.drops  # counted in the log's thread: a snapshot is close enough for a report
        counts.update({f"{drops.receiver}:{reason}": n for reason, n in drops.as_dict().items() if n})
        return counts

    def teardown(self) -> None:
        self.event_logger.stop()
        if self.event_logger.drops.total:
            self.log.warning("dropped malformed events", counts=self.event_logger.drops.as_dict())
