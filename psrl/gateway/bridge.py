"""Hands HTTP calls from the server's event loop to whoever owns the sessions.

The server awaits ``submit``. ``Bridge``: the owner is another thread (the session scheduler's
actor loop), woken through a socket pair it polls (``fileno``); it takes the jobs (``take``) and
answers each (``Job.resolve`` / ``Job.fail``) from its own thread. ``InlineBridge``: the owner is
the server's event loop itself (the in-process gateway, whose sessions' work is a fraction of a
millisecond and never blocks), so a call costs no thread hand-off either way. A job whose client
went away is answered all the same (its turn is recorded; a retry of the same call gets that turn
again).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Job:
    job_id: int
    op: str  # open, chat, completion, get, delete, stats
    session_id: str
    payload: Any
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    inline: bool = False  # answered on the loop's own thread

    def resolve(self, result: Any) -> None:
        if self.inline:
            _settle(self.future, result, None)
        else:
            self.loop.call_soon_threadsafe(_settle, self.future, result, None)

    def fail(self, error: BaseException) -> None:
        if self.inline:
            _settle(self.future, None, error)
        else:
            self.loop.call_soon_threadsafe(_settle, self.future, None, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the client disconnected and its handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Bridge:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)

    async def submit(self, op: str, session_id: str = "", payload: Any = None) -> Any:
        loop = asyncio.get_running_loop()
        job = Job(next(self._ids), op, session_id, payload, loop, loop.create_future())
        self._jobs.put(job)
        with contextlib.suppress(BlockingIOError):  # the owner has wake-ups pending already
            self._writer.send(b"\0")
        return await job.future

    def fileno(self) -> int:
        return self._reader.fileno()

    def take(self) -> list[Job]:
        try:
            while self._reader.recv(4096):
                pass
        except BlockingIOError:
            pass
        jobs = []
        while True:
            try:
                jobs.append(self._jobs.get_nowait())
            except queue.Empty:
                return jobs

    def wait(self, timeout_s: float) -> None:
        """Block until a job may be waiting (for an owner loop with nothing else to do)."""
        import select

        select.select([self._reader], [], [], timeout_s)

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


class Submitter(Protocol):
    async def submit(self, op: str, session_id: str = "", payload: Any = None) -> Any: ...


class InlineBridge:
    """Jobs handled on the server's event loop as they come (``handle``); ``on_loop`` runs once with
    that loop before the first job (to watch the owner's other inputs there)."""

    def __init__(
        self, handle: Callable[[Job], None], on_loop: Callable[[asyncio.AbstractEventLoop], None] | None = None
    ) -> None:
        self._handle, self._on_loop = handle, on_loop
        self._ids = itertools.count(1)

    async def submit(self, op: str, session_id: str = "", payload: Any = None) -> Any:
        loop = asyncio.get_running_loop()
        if self._on_loop is not None:
            self._on_loop(loop)
            self._on_loop = None
        job = Job(next(self._ids), op, session_id, payload, loop, loop.create_future(), inline=True)
        self._handle(job)
        return await job.future
