"""Fine-grain overlap chunk sizing: the clamp rule, computed in one place.

A chunk is the unit of completed prompt groups released to the trainer before the whole
staleness buffer is ready.

* ``mini_batch``: ``ppo_mini_batch_size * multiplier`` groups.
* ``micro_batch``: ``ppo_micro_batch_size_per_gpu * dp_size * multiplier`` samples, rounded up
  to whole groups (only whole groups ever complete).

Clamp rule: a micro-batch chunk larger than one mini-batch becomes a mini-batch chunk; a
mini-batch chunk larger than the whole buffer becomes ``none`` (wait for the buffer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
