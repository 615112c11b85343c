"""Pull a published version in the background, so that a sync only has to load it.

A rollout instance stops generating for the whole of a sync. Pulling the next version into the
puller's host mirror while the engine still generates on the old one leaves only the copy into the
engine inside that stop. One pull at a time: the puller's sockets and mirror belong to the
background thread while it runs, and `take` (which waits for it) hands them back. A prefetch of
another version than the one a sync asks for is not used; the caller then pulls as before.

Under partial rollout the rollout actor also keeps generating after a sync command until the
background pull of that version has landed (`is_pulling`), and only then interrupts its requests:
the wait for the bytes becomes generation time instead of idle time.

Full pulls only: with delta sync the mirror records what the engine holds, so a version pulled but
not loaded would make the next delta wrong.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from psrl.log import get_logger
from psrl.ps.errors import PullFailedError
from psrl.ps.landing import DeviceLanding
from psrl.ps.puller import Puller

CLOSE_WAIT_S = 10.0


@dataclass
class _PrefetchJob:
    version: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # by name: a retried pull replaces
    error: Exception | None = None
    thread: threading.Thread | None = None


class Prefetcher:
    def __init__(self, puller: Puller, max_attempts: int = 5, landing: DeviceLanding | None = None) -> None:
        """`landing`: the pulled version is copied onto the engine's GPU by the same thread (``psrl.ps.landing``)."""
        if puller.delta_sync:
            raise ValueError("prefetching needs full pulls: the delta mirror must match the loaded version")
        self.puller = puller
        self.max_attempts = max_attempts
        self.landing = landing
        self.num_started = self.num_used = 0
        self._job: _PrefetchJob | None = None
        self._log = get_logger("psrl.ps.prefetch")

    @property
    def is_running(self) -> bool:
        return self._job is not None and self._job.thread is not None and self._job.thread.is_alive()

    def is_pulling(self, version: int) -> bool:
        """A background pull of exactly ``version`` is still running."""
        return self.is_running and self._job is not None and self._job.version == version

    def start(self, version: int) -> bool:
        """Start pulling ``version`` unless a pull is running or this or a newer version is held."""
        if self.is_running or (self._job is not None and self._job.version >= version):
            return False
        job = _PrefetchJob(version)
        job.thread = threading.Thread(target=self._run, args=(job,), name=f"ps-prefetch-{version}", daemon=True)
        self._job = job
        self.num_started += 1
        job.thread.start()
        return True

    def take(self, version: int) -> list[tuple[str, torch.Tensor]] | None:
        """Wait for a running pull; the tensors of ``version`` if that is what was pulled, else None.

        The tensors view the puller's mirror: valid until the puller's next pull.
        """
        job, self._job = self._job, None
        if job is None:
            return None
        if job.thread is not None:
            job.thread.join()
        if job.error is not None:
            self._log.warning("ps.prefetch_failed", version=job.version, error=str(job.error))
            return None
        if job.version != version:
            return None
        self.num_used += 1
        return list(job.tensors.items())

    def close(self) -> bool:
        """Wait (bounded) for a running pull; False if it is still running (the puller is then still in use)."""
        job, self._job = self._job, None
        if job is None or job.thread is None:
            return True
        job.thread.join(CLOSE_WAIT_S)
        return not job.thread.is_alive()

    def _run(self, job: _PrefetchJob) -> None:
        try:
            started = time.perf_counter()
            result = self.puller.sync(job.tensors.__setitem__, job.version, self.max_attempts)
            job.version = result.version  # a retired version moves on to the newest one
            pulled = time.perf_counter()
            if self.landing is not None:
                job.tensors = self.landing.land(job.tensors)
            self._log.debug("ps.prefetched", version=job.version, pull_s=round(pulled - started, 3),
                            land_s=round(time.perf_counter() - pulled, 3))  # fmt: skip
        except (PullFailedError, OSError, RuntimeError, ValueError) as exc:
            job.error = exc
