"""One checkpoint write at a time on a background thread, its errors raised on the trainer's thread.

The trainer takes a host snapshot of its state (psrl.trainer.checkpoint.snapshot_checkpoint) and hands
the disk work here, so a periodic save costs a step the copy rather than the write. A write still in
flight when the next save comes is waited for first: snapshots never pile up in host memory."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path


class BackgroundWriter:
    def __init__(self, on_written: Callable[[Path], None]) -> None:
        self._on_written = on_written
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[Path] | None = None

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def submit(self, write: Callable[[], Path]) -> None:
        """Start `write` once the previous write has finished (and raised, if it failed)."""
        self.wait()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending = self._executor.submit(write)

    def reap(self) -> None:
        """Report a finished write (or raise its error); returns at once when none has finished."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def wait(self) -> None:
        """Block until the write in flight, if any, is on disk; raise its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._on_written(pending.result())

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
