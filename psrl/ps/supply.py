"""A rollout instance's weights from the parameter server: a full pull, or a background one taken over.

``PsWeightSupply`` is the PS behind ``psrl.flows.instance.WeightSupply``: ``prefetch`` starts a
background pull of a published version (``psrl.ps.prefetch``), ``fetch`` takes it over when it is
the version a sync asks for and pulls otherwise. Every tensor is pulled before any is loaded, so
a failed pull leaves the engine's weights intact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from psrl.ps.landing import DeviceLanding
from psrl.ps.prefetch import Prefetcher
from psrl.ps.puller import Puller


@dataclass(frozen=True)
class Fetched:
    version: int  # the version pulled (a retired version moves on to the newest one)
    tensors: list[tuple[str, torch.Tensor]]
    prefetched: bool  # the bytes came from a background pull
    pull_ms: float  # getting the bytes into host memory (pulling, or waiting for the background pull)


class PsWeightSupply:
    def __init__(
        self, puller: Puller, *, pull_attempts: int, prefetch: bool, landing: DeviceLanding | None = None
    ) -> None:
        """`landing`: a prefetched version is also copied onto the engine's GPU in the background."""
        self.puller = puller
        self.pull_attempts = pull_attempts
        use = prefetch and not puller.delta_sync
        self.prefetcher = Prefetcher(puller, pull_attempts, landing) if use else None

    def prefetch(self, version: int) -> None:
        if self.prefetcher is not None:
            self.prefetcher.start(version)

    def is_arriving(self, version: int) -> bool:
        """A background pull of ``version`` is still running."""
        return self.prefetcher is not None and self.prefetcher.is_pulling(version)

    def fetch(self, version: int) -> Fetched:
        """Every tensor of ``version``; raises PullFailedError (or ValueError / RuntimeError) when it cannot."""
        started = time.monotonic()
        tensors = self.prefetcher.take(version) if self.prefetcher is not None else None
        was_prefetched = tensors is not None
        if tensors is None:
            pulled: dict[str, torch.Tensor] = {}  # by name: a retried pull replaces what it loaded
            version = self.puller.sync(pulled.__setitem__, version, self.pull_attempts).version
            tensors = list(pulled.items())
        return Fetched(version, tensors, was_prefetched, (time.monotonic() - started) * 1000)

    def close(self) -> None:
        # a pull still running in the background owns the puller's sockets: leave them to the exit
        if self.prefetcher is None or self.prefetcher.close():
            self.puller.close()
