"""Padding-free micro-batches: whole sequences end to end in one row, and how samples are split into them.

Layout. A `PackedBatch` holds the samples' prompt+response tokens concatenated into one row
(`input_ids` [1, T], T = the real tokens, no padding), `position_ids` restarting at 0 for every
sequence and `cu_seqlens` [N + 1] marking the boundaries for the varlen attention
(`psrl.trainer.varlen`). Only the positions that predict a response token go through the LM head
(`logit_positions`, their `targets`); the per-token results are scattered into the padded
`[B, R]` layout of `batch` (`psrl.rl.batch`), whose masks, advantages and old log-probs the losses
use unchanged, so every estimator and aggregation mode works the same packed or padded.

Balancing rule (`plan_packed`). Micro-batches are balanced by real token count (the cost of the
linear layers, the bulk of the step): the number of micro-batches `k` is fixed first (enough
micro-batches to keep each within the token budget under ``actor.use_dynamic_bsz``, else as many as
fixed-size micro-batches of ``ppo_micro_batch_size_per_gpu`` samples), then the samples, longest
first, each go to the micro-batch with the fewest tokens so far that still has room (the LPT rule:
the heaviest micro-batch carries at most 4/3 of the optimum, and exceeds the mean by less than
one sample). Data-parallel ranks hold whole prompt groups, one of every round of `world_size`
groups in arrival order, the round's largest group going to the rank with the fewest tokens in the
mini-batch so far (`psrl.trainer.core.round_owners`); they run the same number of micro-batches
(the largest `k`, one all-reduce), so none waits on a collective with nothing to do. Within a
micro-batch, samples keep the order of their lengths, which keeps the varlen attention's CPU path
(one row per sequence) compact.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from psrl.rl.batch import Batch, Sample, collate
from psrl.trainer.varlen import packed_attention_mask


@dataclass(frozen=True)
class PackedBatch:
    batch: Batch  # the padded per-token tensors [B, R] (masks, rewards, fields) the losses read
    input_ids: Tensor  # [1, T] long
    position_ids: Tensor  # [1, T] long, restarting at 0 for every sequence
    cu_seqlens: Tensor  # [N + 1] int32, sequence boundaries in the packed row
    max_length: int  # longest sequence (prompt + response)
    logit_positions: Tensor  # [n] long: packed position whose output predicts response token j of a row
    targets: Tensor  # [n] long: that response token
    response_slots: Tensor  # [n] long: its flat index in the [B, R] layout

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def model_kwargs(self) -> dict[str, object]:
        """Keyword arguments of a Hugging Face forward on this batch (varlen attention)."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": packed_attention_mask(self.input_ids.device),
            "position_ids": self.position_ids,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
            "use_cache": False,
        }

    def to_padded(self, values: Tensor) -> Tensor:
        """Per-response-token values [n] into the [B, R] layout, zero elsewhere (differentiable)."""
        rows, width = self.batch.token_mask.shape
        flat = values.new_zeros(rows * width).index_copy(0, self.response_slots, values)
        return flat.view(rows, width)

    def to(self, device: torch.device) -> PackedBatch:
        """On `device`; to a GPU through pinned memory without blocking the host (no sync per micro-batch)."""
        batch = self.batch
        moved = {f.name: _to_device(getattr(batch, f.name), device) for f in dataclasses.fields(batch)
                 if isinstance(getattr(batch, f.name), Tensor)}  # fmt: skip
        fields = {name: _to_device(value, device) for name, value in batch.fields.items()}
        return PackedBatch(
            batch=dataclasses.replace(batch, **moved, fields=fields),  # type: ignore[arg-type]
            input_ids=_to_device(self.input_ids, device),
            position_ids=_to_device(self.position_ids, device),
            cu_seqlens=_to_device(self.cu_seqlens, device),
            max_length=self.max_length,
            logit_positions=_to_device(self.logit_positions, device),
            targets=_to_device(self.targets, device),
            response_slots=_to_device(self.response_slots, device),
        )


def _to_device(tensor: Tensor, device: torch.device) -> Tensor:
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def sample_tokens(sample: Sample) -> int:
    return len(sample.trajectory.prompt_token_ids) + sample.trajectory.num_response_tokens


def pack(samples: Sequence[Sample], pad_token_id: int) -> PackedBatch:
    """One packed row of `samples` (CPU tensors; move with `PackedBatch.to`), concatenated in numpy
    from the trajectories' arrays."""
    batch = collate(samples, pad_token_id)
    width = batch.response_length
    ids: list[np.ndarray] = []
    positions: list[np.ndarray] = []
    logit_positions: list[np.ndarray] = []
    slots: list[np.ndarray] = []
    bounds = [0]
    for row, sample in enumerate(samples):
        t = sample.trajectory
        start, num_prompt, num_response = bounds[-1], len(t.prompt_token_ids), t.num_response_tokens
        if num_prompt == 0:
            raise ValueError(
                f"trajectory ({t.prompt_id}, {t.child}) has an empty prompt: nothing predicts its first token"
            )
        ids += [t.prompt_token_ids, t.response_token_ids]
        positions.append(np.arange(num_prompt + num_response))
        bounds.append(start + num_prompt + num_response)
        logit_positions.append(np.arange(num_response) + (start + num_prompt - 1))
        slots.append(np.arange(num_response) + row * width)
    targets = [s.trajectory.response_token_ids for s in samples]
    return PackedBatch(
        batch=batch,
        input_ids=_long(ids)[None, :],
        position_ids=_long(positions)[None, :],
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
        max_length=max(b - a for a, b in itertools.pairwise(bounds)),
        logit_positions=_long(logit_positions),
        targets=_long(targets),
        response_slots=_long(slots),
    )


def _long(parts: list[np.ndarray]) -> Tensor:
    """The parts end to end as one long tensor (a fresh array, so torch takes it without copying)."""
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))


def micro_batch_count(samples: Sequence[Sample], *, max_tokens: int | None, micro_batch_size: int) -> int:
    """Micro-batches this rank needs: enough to keep each within `max_tokens` real tokens (a longer
    sample goes alone), else enough for `micro_batch_size` samples each."""
    if not samples:
        return 0
    if max_tokens is None:
        return -(-len(samples) // micro_batch_size)
    count = -(-sum(sample_tokens(s) for s in samples) // max_tokens)
    while _assign(samples, count, max_tokens) is None:
        count += 1
    return count


def plan_packed(samples: Sequence[Sample], count: int, *, max_tokens: int | None) -> list[list[Sample]]:
    """`samples` split into `count` token-balanced micro-batches (the LPT rule above); empty ones dropped.

    `count` may exceed what the samples need (a data-parallel peer needs more): then the balance
    still holds and some micro-batches are smaller."""
    if not samples:
        return []
    parts = _assign(samples, max(1, count), max_tokens)
    if parts is None:  # more micro-batches always fit: raise the count until they do
        return plan_packed(samples, count + 1, max_tokens=max_tokens)
    return [sorted(part, key=sample_tokens) for part in parts if part]


def _assign(samples: Sequence[Sample], count: int, max_tokens: int | None) -> list[list[Sample]] | None:
    """Longest first, each to the lightest micro-batch that has room; None when one does not fit."""
    parts: list[list[Sample]] = [[] for _ in range(count)]
    heap = [(0, index) for index in range(count)]  # (tokens, micro-batch)
    for sample in sorted(samples, key=sample_tokens, reverse=True):
        tokens, index = heapq.heappop(heap)
        size = sample_tokens(sample)
        if max_tokens is not None and tokens > 0 and tokens + size > max_tokens:
            return None  # the lightest has no room, so none has
        parts[index].append(sample)
        heapq.heappush(heap, (tokens + size, index))
    return parts
