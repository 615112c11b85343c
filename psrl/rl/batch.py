"""Padded tensor batches built from trajectories.

Layout (as in veRL): prompts are left-padded to the batch's longest prompt `P` and responses
right-padded to the longest response `R`, so response token `j` of every row sits at column
`P + j` and every per-token tensor of the response has shape `[B, R]`.

A `Sample` pairs a trajectory with the per-token values the trainer computed for it (old and
reference log-probs, values, advantages, ...). Samples are collated on demand, so any subset
(a chunk, a mini-batch, a micro-batch) becomes a batch with only its own padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from psrl.rl.trajectory import Trajectory


@dataclass
class Sample:
    trajectory: Trajectory
    fields: dict[str, Tensor] = field(default_factory=dict)  # name -> float32 [num_response_tokens]


@dataclass(frozen=True)
class Batch:
    input_ids: Tensor  # [B, P + R] long
    attention_mask: Tensor  # [B, P + R] long, 1 = real token
    position_ids: Tensor  # [B, P + R] long
    prompt_length: int  # P
    token_mask: Tensor  # [B, R] float32, 1 = real response token
    response_mask: Tensor  # [B, R] float32, 1 = trained response token (token_mask x loss_mask)
    rollout_log_probs: Tensor  # [B, R] float32, 0 where absent
    has_rollout_log_probs: bool  # every row came with engine log-probs
    token_versions: Tensor  # [B, R] long, -1 where unknown or padding
    rewards: Tensor  # [B] float32
    acc: Tensor  # [B] float32, nan where the task gave none
    versions: Tensor  # [B] long, V_traj
    group_index: Tensor  # [B] long, index of the prompt group (order of first appearance)
    fields: dict[str, Tensor]  # name -> [B, R] float32, zero-padded

    @property
    def num_seqs(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_length(self) -> int:
        return int(self.token_mask.shape[1])

    def response_token_ids(self) -> Tensor:
        return self.input_ids[:, self.prompt_length :]

    def to(self, device: torch.device) -> Batch:
        moved = {name: getattr(self, name).to(device) for name in _TENSOR_FIELDS}
        fields = {k: v.to(device) for k, v in self.fields.items()}
        return Batch(
            **moved, prompt_length=self.prompt_length, has_rollout_log_probs=self.has_rollout_log_probs, fields=fields
        )


_TENSOR_FIELDS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "token_mask",
    "response_mask",
    "rollout_log_probs",
    "token_versions",
    "rewards",
    "acc",
    "versions",
    "group_index",
)


def collate(samples: Sequence[Sample], pad_token_id: int) -> Batch:
    """Pad `samples` into one batch (CPU tensors; move with `Batch.to`), filled in numpy from the
    trajectories' arrays and handed to torch without another copy."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    trajectories = [s.trajectory for s in samples]
    prompt_len = max(len(t.prompt_token_ids) for t in trajectories)
    response_len = max([1, *(t.num_response_tokens for t in trajectories)])
    num = len(samples)
    input_ids = np.full((num, prompt_len + response_len), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros_like(input_ids)
    token_mask = np.zeros((num, response_len), np.float32)
    response_mask = np.zeros((num, response_len), np.float32)
    rollout_log_probs = np.zeros((num, response_len), np.float32)
    token_versions = np.full((num, response_len), -1, dtype=np.int64)
    for row, t in enumerate(trajectories):
        start, n = prompt_len - len(t.prompt_token_ids), t.num_response_tokens
        input_ids[row, start:prompt_len] = t.prompt_token_ids
        input_ids[row, prompt_len : prompt_len + n] = t.response_token_ids
        attention_mask[row, start : prompt_len + n] = 1
        token_mask[row, :n] = 1.0
        response_mask[row, :n] = t.loss_mask if len(t.loss_mask) else 1.0
        if len(t.rollout_log_probs):
            rollout_log_probs[row, :n] = t.rollout_log_probs
        if len(t.token_versions):
            token_versions[row, :n] = t.token_versions
    attention = torch.from_numpy(attention_mask)
    return Batch(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=attention,
        position_ids=(attention.cumsum(dim=1) - 1).clamp(min=0),
        prompt_length=prompt_len,
        token_mask=torch.from_numpy(token_mask),
        response_mask=torch.from_numpy(response_mask),
        rollout_log_probs=torch.from_numpy(rollout_log_probs),
        has_rollout_log_probs=all(len(t.rollout_log_probs) or not len(t.response_token_ids) for t in trajectories),
        token_versions=torch.from_numpy(token_versions),
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        acc=torch.tensor([float("nan") if t.acc is None else t.acc for t in trajectories], dtype=torch.float32),
        versions=torch.tensor([t.version for t in trajectories], dtype=torch.long),
        group_index=group_indices(trajectories),
        fields=_collate_fields(samples, response_len),
    )


def _collate_fields(samples: Sequence[Sample], response_len: int) -> dict[str, Tensor]:
    names = set(samples[0].fields)
    if any(set(s.fields) != names for s in samples):
        raise ValueError("samples of one batch must carry the same per-token fields")
    out = {}
    for name in sorted(names):
        padded = torch.zeros(len(samples), response_len)
        for row, sample in enumerate(samples):
            values = sample.fields[name]
            padded[row, : values.shape[0]] = values
        out[name] = padded
    return out


def group_indices(trajectories: Sequence[Trajectory]) -> Tensor:
    """Index of each trajectory's prompt group, numbered by first appearance."""
    index: dict[int, int] = {}
    return torch.tensor([index.setdefault(t.prompt_id, len(index)) for t in trajectories], dtype=torch.long)


def scatter_rows(batch_values: Tensor, samples: Sequence[Sample], name: str) -> None:
    """Store row `i` of a `[B, R]` tensor into `samples[i].fields[name]`, trimmed to its response length."""
    # one copy off the device for the whole tensor: a copy per row waited for the device once per sample
    on_host = batch_values.detach().to("cpu", torch.float32)
    for row, sample in enumerate(samples):
        n = sample.trajectory.num_response_tokens
        sample.fields[name] = on_host[row, :n].clone()
