"""Checksum verification on helper threads, overlapping the receive of the next entries.

xxh3 releases the GIL, so while a helper thread hashes one entry, the receiving thread copies the
next one out of ZeroMQ. Results come back in submission order, so callers load tensors in the
order their bytes arrived.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait

from psrl.ps.manifest import NO_CHECKSUM, ManifestEntry
from psrl.ps.serving import is_intact


class Verifier:
    def __init__(self, num_threads: int = 1) -> None:
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="ps-verify")
        self._pending: deque[tuple[int, ManifestEntry, Future[bool]]] = deque()

    def submit(self, entry: ManifestEntry, view: memoryview, algorithm: str, tag: int = 0) -> None:
        """Check ``view`` against ``entry``; ``tag`` comes back with the verdict (e.g. the push it belongs to)."""
        if algorithm == NO_CHECKSUM:
            done: Future[bool] = Future()
            done.set_result(len(view) == entry.num_bytes)
            self._pending.append((tag, entry, done))
            return
        self._pending.append((tag, entry, self._pool.submit(is_intact, entry, view, algorithm)))

    def completed(self, timeout_s: float = 0.0) -> list[tuple[int, ManifestEntry, bool]]:
        """(tag, entry, is_intact) finished so far, in submission order; waits up to ``timeout_s`` for one."""
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
        """Forget outstanding verdicts (their pull or push was abandoned)."""
        self._pending.clear()

    def close(self) -> None:
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
