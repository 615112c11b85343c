"""What a pull returns: the ``PullResult`` and the ``PullStream`` iterator that times the engine's load."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from psrl.ps.manifest import ManifestEntry


@dataclass(frozen=True)
class PullResult:
    version: int
    digest: bytes
    num_bytes: int  # bytes transferred
    num_bytes_total: int  # bytes of the whole version as served
    num_entries: int  # entries transferred
    num_tensors_loaded: int
    manifest_s: float
    transfer_s: float  # time in the pull itself (receive + verify), excluding load
    load_s: float  # time spent in the engine's load callback
    num_attempts: int = 1

    @property
    def num_bytes_saved(self) -> int:
        return self.num_bytes_total - self.num_bytes

    def with_attempts(self, num_attempts: int) -> PullResult:
        return dataclasses.replace(self, num_attempts=num_attempts)


class PullStream:
    """Iterator of (name, tensor) for one pull; time spent by the consumer is counted as load time.

    ``run(stream)`` is the pull itself: it yields tensors, sets ``manifest_s`` and adds to
    ``num_bytes``, and calls ``finish`` once the version is complete.
    """

    def __init__(self, run: Callable[[PullStream], Iterator[tuple[str, torch.Tensor]]]) -> None:
        self._run = run
        self.manifest_s = 0.0
        self.num_bytes = 0
        self._load_s = 0.0
        self._result: PullResult | None = None
        self._started = 0.0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._started = time.perf_counter()
        for item in self._run(self):
            handed = time.perf_counter()
            yield item
            self._load_s += time.perf_counter() - handed

    def finish(
        self, version: int, digest: bytes, entries: Sequence[ManifestEntry], num_needed: int, num_loaded: int
    ) -> None:
        elapsed = time.perf_counter() - self._started
        self._result = PullResult(
            version=version,
            digest=digest,
            num_bytes=self.num_bytes,
            num_bytes_total=sum(e.num_bytes for e in entries),
            num_entries=num_needed,
            num_tensors_loaded=num_loaded,
            manifest_s=self.manifest_s,
            transfer_s=max(0.0, elapsed - self._load_s - self.manifest_s),
            load_s=self._load_s,
        )

    @property
    def result(self) -> PullResult:
        if self._result is None:
            raise RuntimeError("the pull has not completed (iterate the stream to the end first)")
        return self._result
