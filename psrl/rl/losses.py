"""Per-token losses and their aggregation into one scalar.

Every function returns per-token values `[B, R]`; `aggregate` turns them into the batch loss. When
a mini-batch is split into micro-batches (and across data-parallel ranks), pass the mini-batch's
global denominators so the accumulated gradient equals that of one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

AggregationMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLType = Literal["k1", "k2", "low_var_kl"]
LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class PolicyLossTerms:
    token_losses: Tensor  # [B, R] (IS weights applied, not yet aggregated)
    ratio: Tensor  # [B, R] pi_theta / pi_old
    is_clipped: Tensor  # [B, R] bool: the clipped branch was taken
    approx_kl: Tensor  # [B, R] old_log_prob - log_prob


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    is_weights: Tensor | None = None,
    clip_ratio_c: float | None = None,
) -> PolicyLossTerms:
    """PPO clipped surrogate with an asymmetric clip range: max(-A r, -A clip(r, 1-low, 1+high)).

    Dual clip (`clip_ratio_c`): where A < 0 the loss is also capped at -A c, so a token whose ratio
    has grown far above 1 cannot contribute an unbounded gradient (the surrogate is flat there).
    """
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    token_losses = torch.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        dual = (advantages < 0) & (token_losses > cap)
        token_losses = torch.where(dual, cap, token_losses)
        is_clipped = is_clipped | dual
    if is_weights is not None:
        token_losses = token_losses * is_weights
    return PolicyLossTerms(token_losses, ratio, is_clipped, -log_ratio)


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: KLType) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from sampled tokens (k1, k2 or k3 = low_var_kl)."""
    log_ratio = log_probs - ref_log_probs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    ref_over_policy = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(ref_over_policy) - ref_over_policy - 1.0).clamp(-10.0, 10.0)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position: logsumexp(z) - sum(softmax(z) z)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, *, clip_range: float) -> tuple[Tensor, Tensor]:
    """Clipped value loss 0.5 * max((v - R)^2, (clip(v) - R)^2); returns (token losses, is_clipped)."""
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped_loss, clipped_loss), clipped_loss > unclipped_loss


def aggregate(
    token_values: Tensor,
    mask: Tensor,
    mode: AggregationMode,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    token_norm: float | None = None,
) -> Tensor:
    """Reduce `[B, R]` values to a scalar.

    token-mean: sum over trained tokens / num_tokens. seq-mean-token-mean: mean over sequences of
    each sequence's token mean. seq-mean-token-sum: mean over sequences of each token sum.
    seq-mean-token-sum-norm (Dr.GRPO): the token sum over sequences / (num_seqs x token_norm), a
    constant normaliser, so a long response's tokens weigh as much as a short one's.
    `num_tokens` / `num_seqs` default to this batch's own counts and `token_norm` to its padded
    length (pass the configured constant so micro-batches agree); sequences without a trained token
    count in the denominator of the seq modes (they contribute 0).
    """
    masked = token_values * mask
    if mode == "token-mean":
        denominator = mask.sum().item() if num_tokens is None else num_tokens
        return masked.sum() / max(denominator, 1.0)
    seqs = float(token_values.shape[0]) if num_seqs is None else num_seqs
    per_seq = masked.sum(dim=1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(dim=1).clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        seqs *= float(token_values.shape[1]) if token_norm is None else token_norm
    return per_seq.sum() / max(seqs, 1.0)
