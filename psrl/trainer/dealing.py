"""Which of a buffer's samples each optimizer step trains on.

By default a mini-batch is ``ppo_mini_batch_size`` whole prompt groups, in the order they arrived: every
step contrasts the answers of a few prompts. With ``actor.shuffle_samples`` the buffer's samples are dealt
into as many mini-batches at random, so each step sees answers to most of the buffer's prompts (TRL's
GRPOTrainer shuffles its generation batch the same way). The advantages are computed on whole groups
before any dealing, so only the composition of the steps changes.

The deal is a pure function of the trainer's seed, the buffer, the epoch and the rank: a replay, a resumed
run and every rank (each deals its own samples) reproduce it, and torch's random streams are not touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def dealt_mini_batches(
    groups: Sequence[Sequence[T]], groups_per_mini_batch: int, *, seed: int, buffer_id: int, epoch: int, rank: int = 0
) -> list[list[T]]:
    """The samples of ``groups`` in a seeded random order, split into as many mini-batches as whole groups
    would make, of sizes differing by at most one."""
    samples = [s for g in groups for s in g]
    if not samples:
        return []
    count = -(-len(groups) // max(1, groups_per_mini_batch))
    order = np.random.default_rng([v & 0xFFFFFFFF for v in (seed, buffer_id, epoch, rank)]).permutation(len(samples))
    return [[samples[i] for i in part] for part in np.array_split(order, count)]
