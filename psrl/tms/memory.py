"""A side's managed GPU memory at run time: where its allocations go, and its pause and resume.

The trainer and the engine allocate through ``SideMemory.region(name)`` (a no-op for a region the
range does not manage) and capture CUDA graphs through ``graph_capture``. ``pause`` releases every
managed region and ``resume`` re-acquires them at the same virtual addresses, each timed and
measured against the device's free memory. The backend is torch-memory-saver on CUDA
(``psrl.tms.backend``); unit tests pass their own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from psrl.tms.regions import Region


class MemoryBackend(Protocol):
    def region(self, tag: str, keeps_contents: bool) -> contextlib.AbstractContextManager[Any]: ...

    def graph_capture(self, graph: Any, pool: Any, tag: str) -> contextlib.AbstractContextManager[Any]: ...

    def pause(self, tag: str) -> None: ...

    def resume(self, tag: str) -> None: ...

    def synchronize(self) -> None: ...

    def free_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SwitchReport:
    side: str
    action: str  # "pause" | "resume"
    regions: tuple[str, ...]
    duration_ms: float
    changed_bytes: int  # released by a pause, re-acquired by a resume
    free_bytes: int
    region_ms: dict[str, float] = field(default_factory=dict)


class SideMemory:
    def __init__(
        self,
        side: str,
        regions: Sequence[Region],
        backend: MemoryBackend | None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if regions and backend is None:
            raise ValueError(f"{side}: managed regions need a memory backend")
        if any(region.side != side for region in regions):
            raise ValueError(f"{side}: regions of another side given: {[r.tag for r in regions]}")
        self.side = side
        self.regions = {region.name: region for region in regions}
        self.backend = backend
        self.clock = clock
        self.is_paused = False

    @classmethod
    def unmanaged(cls, side: str) -> SideMemory:
        """Every allocation stays resident (``psrl.tms.range`` does not cover this side)."""
        return cls(side, (), None)

    @property
    def is_managed(self) -> bool:
        return bool(self.regions)

    def region(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Allocations made inside go to region ``name`` when it is managed, else stay resident."""
        region = self.regions.get(name)
        if region is None or self.backend is None:
            return contextlib.nullcontext()
        return self.backend.region(region.tag, region.keeps_contents)

    def graph_capture(self, graph: Any, pool: Any) -> contextlib.AbstractContextManager[Any]:
        """``torch.cuda.graph(graph, pool=pool)``, with the graph's memory in the ``cuda_graph`` region if managed."""
        region = self.regions.get("cuda_graph")
        if region is None or self.backend is None:
            import torch

            return torch.cuda.graph(graph, pool=pool)
        return self.backend.graph_capture(graph, pool, region.tag)

    def pause(self) -> SwitchReport:
        """Release every managed region (the caller has stopped all GPU work of this side)."""
        return self._switch("pause", reversed(list(self.regions.values())))

    def resume(self) -> SwitchReport:
        return self._switch("resume", iter(self.regions.values()))

    def _switch(self, action: str, regions: Iterator[Region]) -> SwitchReport:
        names, backend = tuple(self.regions), self.backend
        if backend is None:  # nothing managed
            return SwitchReport(self.side, action, names, 0.0, 0, 0)
        if self.is_paused == (action == "pause"):  # a repeated command: nothing to do, reported again
            return SwitchReport(self.side, action, names, 0.0, 0, backend.free_bytes())
        backend.synchronize()
        free_before = backend.free_bytes()
        started = self.clock()
        region_ms = {}
        switch = backend.pause if action == "pause" else backend.resume
        for region in regions:
            region_started = self.clock()
            switch(region.tag)
            backend.synchronize()
            region_ms[region.name] = (self.clock() - region_started) * 1000
        duration_ms = (self.clock() - started) * 1000
        free_after = backend.free_bytes()
        self.is_paused = action == "pause"
        changed = free_after - free_before if action == "pause" else free_before - free_after
        return SwitchReport(self.side, action, names, duration_ms, changed, free_after, region_ms)
