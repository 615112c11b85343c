"""A prefill step's new tokens packed back to back: the layout the engine builds, the attention
kernels read and the models' torch attention reads too (so it sits below both)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class PackedPrefill:
    """A prefill step's new tokens, packed back to back, described per sequence for attention."""

    block_tables: torch.Tensor  # [B, W] block ids, padded with block 0
    context_starts: torch.Tensor  # [B] position of each sequence's first new token
    query_starts: torch.Tensor  # [B] packed row of each sequence's first new token
    query_lens: torch.Tensor  # [B] new tokens of each sequence
    query_lens_list: list[int]
    seq_index: torch.Tensor  # [N] sequence of each packed token
    offset_in_seq: torch.Tensor  # [N] index of each packed token among its sequence's new tokens
    slot_mapping: torch.Tensor  # [N] cache slot of each packed token
