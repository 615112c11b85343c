"""The trainer's warm-up: its compiled layers built on a synthetic buffer while the first real one is generated.

Why: with ``actor.compile`` a trainer's first step builds every compiled graph it runs (the no-grad forward of
the old log-probs, the update's forward and its backward): 10-25 s for a 0.5B model on a fresh machine, all
of it after the first batch arrived, so the first version waits for rollout *and then* for the compiler.
Building them on made-up data while the engines load and generate takes that time off the first step.

How: two buffers of the run's shape (its groups and group size, random tokens and rewards; response lengths
spread up to the limit, then all at it, since the compiler specializes some kernels by a micro-batch's size:
a real run's first micro-batch past such a size rebuilt them for 3.6 s at step 11) go through the trainer's
own ``train_buffer``, so the paths the real buffers take are traced, with each optimizer swapped for one that
steps nothing. Weights, optimizer state, the random streams, the version and the dataset cursor are as
before; the gradients are dropped.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import numpy as np
import torch

from psrl.rl.trajectory import Trajectory

WarmUpSetting = bool | Literal["auto"]
PROMPT_TOKENS = 48  # the longest synthetic prompt: graphs are built for dynamic shapes, so any lengths trace them


def warm_up_enabled(setting: WarmUpSetting, *, compiles: bool, world_size: int, memory_managed: bool) -> bool:
    """``auto``: where the trainer compiles, alone (one rank: several would have to warm up in step) and with
    its GPU memory resident (under colocation the rollout holds the GPU while the first batch is made)."""
    if setting == "auto":
        return compiles and world_size == 1 and not memory_managed
    return setting is True


def synthetic_buffer(
    *,
    groups: int,
    group_size: int,
    max_prompt_tokens: int,
    max_response_tokens: int,
    vocab_size: int,
    version: int,
    seed: int = 0,
    full_length: bool = False,
) -> list[Trajectory]:
    """`groups` x `group_size` trajectories of random tokens: response lengths spread evenly up to the
    limit, or all at the limit (`full_length`: micro-batches as full as the token budget makes them; the
    compiler specializes some kernels by size, so a warm-up runs both); rewards alternating so that
    advantages are not all zero."""
    rng = np.random.default_rng(seed)
    longest_prompt = max(1, min(PROMPT_TOKENS, max_prompt_tokens))
    out = []
    for group in range(groups):
        # lengths that vary as real prompts do: one length for all would let the compiler take it for a constant
        prompt = rng.integers(0, vocab_size, int(rng.integers(1, longest_prompt + 1)), dtype=np.int64)
        for child in range(group_size):
            index = group * group_size + child
            length = max_response_tokens
            if not full_length:
                length = 1 + (index * (max_response_tokens - 1)) // max(1, groups * group_size - 1)
            out.append(
                Trajectory(
                    prompt_id=group,
                    child=child,
                    prompt_token_ids=prompt,
                    response_token_ids=rng.integers(0, vocab_size, length, dtype=np.int64),
                    rollout_log_probs=np.full(length, -1.0, np.float32),
                    token_versions=np.full(length, version, np.int32),
                    version=version,
                    reward=float(child % 2),
                )
            )
    return out


def vocab_size_of(model: torch.nn.Module) -> int:
    config: Any = getattr(model, "config", None)
    if config is None or not hasattr(config, "vocab_size"):
        raise TypeError(f"{type(model).__name__} has no config.vocab_size: no synthetic tokens for its warm-up")
    return int(config.vocab_size)


class StepNothing:
    """Stands in for an optimizer during the warm-up: the same parameter groups, no step."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self.param_groups = optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        return None


@contextmanager
def random_streams_kept(device: torch.device) -> Iterator[None]:
    """Python's, numpy's and torch's random streams (the device's too) as they were before the block."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_state: Any = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, device)
