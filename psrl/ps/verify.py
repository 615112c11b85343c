"""Per-entry work (checksums, casts) on a helper thread, overlapping the receive of later entries.

xxh3 and torch copies release the GIL, so while the helper checks (and, on a shard, casts) one
entry, the receiving thread copies the next one out of ZeroMQ. Results come back in submission
order, so callers load tensors in the order their bytes arrived.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

from psrl.ps.manifest import ManifestEntry

ResultT = TypeVar("ResultT")
# One thread hashes or copies about 10 GB/s of host memory; a 7B version is 15 GB, and a large host's
# memory bandwidth takes several threads to reach.
MAX_HOST_THREADS = 8


def host_threads() -> int:
    """Threads for one version's host-side checksums and copies (at most the CPUs)."""
    return max(1, min(MAX_HOST_THREADS, os.cpu_count() or 1))


class Verifier(Generic[ResultT]):
    def __init__(self, num_threads: int = 1) -> None:
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="ps-verify")
        self._pending: deque[tuple[int, ManifestEntry, Future[ResultT]]] = deque()

    def submit(self, tag: int, entry: ManifestEntry, job: Callable[[], ResultT]) -> None:
        """Run ``job`` for ``entry``; ``tag`` comes back with its result (e.g. the push it belongs to)."""
        self._pending.append((tag, entry, self._pool.submit(job)))

    def completed(self, timeout_s: float = 0.0) -> list[tuple[int, ManifestEntry, ResultT]]:
        """(tag, entry, result) finished so far, in submission order; waits up to ``timeout_s`` for one."""
        if self._pending and timeout_s > 0:
            wait([self._pending[0][2]], timeout=timeout_s)
        out = []
        while self._pending and self._pending[0][2].done():
            tag, entry, future = self._pending.popleft()
            out.append((tag, entry, future.result()))
        return out

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def clear(self) -> None:
        """Forget outstanding results (their pull or push was abandoned). Jobs not started are cancelled
        and running ones waited for: a job may write into buffers (a puller's mirror) the next one reuses."""
        futures = [future for _, _, future in self._pending]
        self._pending.clear()
        for future in futures:
            future.cancel()
        wait(futures)

    def close(self) -> None:
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
