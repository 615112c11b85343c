"""One job at a time on a background thread; its result handed over, and its error raised, on the owner's thread.

The trainer uses one for checkpoint writes (it takes a host snapshot of its state and hands the disk
work here, so a periodic save costs a step the copy rather than the write) and one for weight pushes
(a snapshot of the weights goes to the parameter server while the next step trains). A job still in
flight when the next one comes is waited for first: snapshots never pile up, and jobs finish in order.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class BackgroundJob(Generic[T]):
    """``on_done(result)`` runs on the owner's thread, from ``reap``/``wait``; ``wake`` (optional) is called on the
    worker thread as a job finishes, so an owner blocked on its inputs can come and reap it at once."""

    def __init__(self, on_done: Callable[[T], None], *, name: str, wake: Callable[[], None] | None = None) -> None:
        self._on_done = on_done
        self._name = name
        self._wake = wake
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[T] | None = None

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def submit(self, job: Callable[[], T]) -> None:
        """Start `job` once the previous one has finished (and raised, if it failed)."""
        self.wait()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        self._pending = self._executor.submit(job)
        if self._wake is not None:
            wake = self._wake
            self._pending.add_done_callback(lambda _: wake())

    def reap(self) -> None:
        """Report a finished job (or raise its error); returns at once when none has finished."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def wait(self) -> None:
        """Block until the job in flight, if any, is done; report it, or raise its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._on_done(pending.result())

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
