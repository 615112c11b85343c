"""Hands HTTP calls from the server's event loop thread to the thread that owns the sessions.

The server awaits ``submit``; the owner (the session scheduler's actor loop, or an in-process
engine loop) is woken through a socket pair it polls (``fileno``), takes the jobs (``take``) and
answers each (``Job.resolve`` / ``Job.fail``) from its own thread. A job whose client went away is
answered all the same (its turn is recorded; a retry of the same call gets that turn again).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import socket
from dataclasses import dataclass
from typing import Any


@dataclass
class Job:
    job_id: int
    op: str  # open, chat, completion, get, delete, stats
    session_id: str
    payload: Any
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]

    def resolve(self, result: Any) -> None:
        self.loop.call_soon_threadsafe(_settle, self.future, result, None)

    def fail(self, error: BaseException) -> None:
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
