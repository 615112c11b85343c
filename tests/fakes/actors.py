"""A real actor that misbehaves on cue (options in its boot line)."""

from __future__ import annotations

import errno
import os
import signal
import time

from actors.base import Actor, Inputs
from actors.boot import Boot
from actors.logger import LoggerActor
from bus.messages import Metrics, RunFinished
from bus.schema import Event


class FakeActor(Actor):
    """Options: fail_at_start, slow_start_s, slow_stop_s, ignore_sigterm, drop_every, finish_after_s, tick_s."""

    ROLE = "fake"

    def setup(self) -> dict[str, int]:
        opts = self.boot.options
        if opts.get("fail_at_start"):
            raise RuntimeError("told to fail at start")
        time.sleep(float(opts.get("slow_start_s", 0)))
        if opts.get("ignore_sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.started = time.monotonic()
        self.num_seen = 0
        self.num_dropped = 0
        self.ticks = 0
        self.every(float(opts.get("tick_s", 0.2)), self._tick)
        return {"fake": 1}

    def _tick(self) -> None:
        self.ticks += 1
        self.publisher.publish(Metrics(self.ticks, {"seen": float(self.num_seen), "dropped": float(self.num_dropped)}))
        finish_after = self.boot.options.get("finish_after_s")
        if finish_after is not None and time.monotonic() - self.started >= float(finish_after):
            self.publisher.publish(RunFinished(True, "fake run done", {"ticks": float(self.ticks)}))
            self.boot.options["finish_after_s"] = None

    def inputs(self) -> Inputs:
        return Inputs(bus={Metrics: self._on_metrics})

    def _on_metrics(self, event: Event[Metrics]) -> None:
        self.num_seen += 1
        drop_every = int(self.boot.options.get("drop_every", 0))
        if drop_every and self.num_seen % drop_every == 0:
            self.num_dropped += 1

    def teardown(self) -> None:
        time.sleep(float(self.boot.options.get("slow_stop_s", 0)))

    def request_stop(self, reason: str) -> None:
        if self.boot.options.get("ignore_sigterm") and reason.startswith(("SIGTERM", "shutdown")):
            return
        super().request_stop(reason)


class TorchFakeActor(FakeActor):
    """A FakeActor whose setup imports torch, as the tensor roles' does: a cold start pays the import,
    a warm spare (which imports ``WARM_IMPORTS`` ahead of need) does not."""

    WARM_IMPORTS = (*FakeActor.WARM_IMPORTS, "torch")

    def setup(self) -> dict[str, int]:
        import torch

        capacity = super().setup()
        return {**capacity, "threads": torch.get_num_threads()}


class FullDiskLogger(LoggerActor):
    """The real logger on a disk that fills: options ``disk_full_after_s`` (its writes then fail with
    ENOSPC) or ``disk_full_on_close`` (only the log's last write, as the run stops, fails)."""

    def __init__(self, boot: Boot) -> None:
        super().__init__(boot)
        writer = self.event_logger.writer
        if boot.options.get("disk_full_on_close"):
            writer.close = _full_disk  # type: ignore[method-assign]
        full_after = boot.options.get("disk_full_after_s")
        if full_after is not None:
            full_at, flush = time.monotonic() + float(full_after), writer.flush

            def flush_until_full() -> None:
                if time.monotonic() >= full_at:
                    _full_disk()
                flush()

            writer.flush = flush_until_full  # type: ignore[method-assign]


def _full_disk() -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
