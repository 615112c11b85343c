"""The chunk plan: how much of a staleness buffer goes to the trainer at a time (fine-grain overlap).

Pure arithmetic over the run's batch sizes, so the config checks, the coordinator (which emits the
chunks, `psrl.coordination.chunks`) and the trainer (which trains them) all read the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from psrl.config.root import Config

Granularity = Literal["none", "mini_batch", "micro_batch"]


@dataclass(frozen=True)
class ChunkPlan:
    """How a buffer is released to the trainer."""

    requested: Granularity
    effective: Granularity
    chunk_groups: int
    clamped: bool

    def num_chunks(self, buffer_groups: int) -> int:
        return -(-buffer_groups // self.chunk_groups)


def plan_chunks(
    granularity: Granularity,
    multiplier: int,
    *,
    buffer_groups: int,
    rollout_n: int,
    ppo_mini_batch_size: int,
    ppo_micro_batch_size_per_gpu: int,
    dp_size: int,
) -> ChunkPlan:
    """Apply the clamp rule and return the effective granularity and chunk size in groups."""
    if granularity == "none":
        return ChunkPlan("none", "none", buffer_groups, clamped=False)
    if granularity == "micro_batch":
        samples = ppo_micro_batch_size_per_gpu * dp_size * multiplier
        if samples <= ppo_mini_batch_size * rollout_n:
            return ChunkPlan("micro_batch", "micro_batch", -(-samples // rollout_n), clamped=False)
        clamped = _mini_batch_plan(ppo_mini_batch_size, buffer_groups)
        return ChunkPlan("micro_batch", clamped.effective, clamped.chunk_groups, clamped=True)
    plan = _mini_batch_plan(ppo_mini_batch_size * multiplier, buffer_groups)
    return ChunkPlan("mini_batch", plan.effective, plan.chunk_groups, clamped=plan.effective != "mini_batch")


def _mini_batch_plan(groups: int, buffer_groups: int) -> ChunkPlan:
    if groups > buffer_groups:
        return ChunkPlan("mini_batch", "none", buffer_groups, clamped=True)
    return ChunkPlan("mini_batch", "mini_batch", groups, clamped=False)


def chunk_plan(c: Config) -> ChunkPlan:
    """The run's chunk plan (``psrl.fine_grain_overlap`` against its batch sizes)."""
    fgo = c.psrl.fine_grain_overlap
    return plan_chunks(
        fgo.granularity,
        fgo.multiplier,
        buffer_groups=c.psrl.staleness_buffer_entries,
        rollout_n=c.psrl.rollout_n,
        ppo_mini_batch_size=c.actor.ppo_mini_batch_size,
        ppo_micro_batch_size_per_gpu=c.actor.ppo_micro_batch_size_per_gpu,
        dp_size=c.topology.n_trainer_ranks,
    )
