"""Which GPU memory lives in which torch-memory-saver region, and which regions a ``psrl.tms.range`` manages.

Trainer: ``weights`` (model parameters, and the reference model when one is loaded) and ``optimizer``
(Adam moments) keep their contents across a pause in a host copy; ``grads`` (gradients and the
training step's activations) is released without a copy, since every step starts by zeroing them.
Rollout: ``weights`` keeps a host copy; ``kv_cache`` is released without one (the engine preempts
its sequences and forgets its prefix cache first); ``cuda_graph`` holds the captured decode graphs'
private memory (only with ``psrl.tms.enable_cuda_graph``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TRAINER = "trainer"
ROLLOUT = "rollout"
SIDES = (TRAINER, ROLLOUT)

Range = Literal["train", "rollout", "all"]


@dataclass(frozen=True, slots=True)
class Region:
    side: str
    name: str
    keeps_contents: bool  # a host copy is taken on pause and written back on resume

    @property
    def tag(self) -> str:
        """The torch-memory-saver tag: distinct per side, so one process may hold both (tests, benchmarks)."""
        return f"{self.side}.{self.name}"


_REGIONS = {
    TRAINER: (Region(TRAINER, "weights", True), Region(TRAINER, "optimizer", True), Region(TRAINER, "grads", False)),
    ROLLOUT: (Region(ROLLOUT, "weights", True), Region(ROLLOUT, "kv_cache", False)),
}
CUDA_GRAPH = Region(ROLLOUT, "cuda_graph", False)


def managed_sides(tms_range: Range | None) -> tuple[str, ...]:
    """The sides whose memory a range releases while idle."""
    if tms_range is None:
        return ()
    return {"train": (TRAINER,), "rollout": (ROLLOUT,), "all": SIDES}[tms_range]


def managed_regions(tms_range: Range | None, side: str, *, enable_cuda_graph: bool = False) -> tuple[Region, ...]:
    """The regions of ``side`` that ``tms_range`` manages (empty: the side's memory stays resident)."""
    if side not in SIDES:
        raise ValueError(f"unknown side {side!r} (one of {SIDES})")
    if side not in managed_sides(tms_range):
        return ()
    graphs = (CUDA_GRAPH,) if side == ROLLOUT and enable_cuda_graph else ()
    return _REGIONS[side] + graphs
