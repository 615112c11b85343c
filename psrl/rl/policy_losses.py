"""The sequence-level and clipped-weight policy losses (GSPO, CISPO), and the choice among all of them.

Like `psrl.rl.losses.policy_loss` (PPO), each returns per-token losses `[B, R]` (IS weights applied)
for `aggregate`, and the ratio, the clipped positions and the approximate KL for the metrics.
"""

from __future__ import annotations

import torch
from torch import Tensor

from psrl.config.training import PolicyLoss
from psrl.rl.losses import LOG_RATIO_CLAMP, PolicyLossTerms, policy_loss

# GSPO's sequence log-ratio is clamped above only: a large one would overflow, a small one is a tiny ratio
GSPO_LOG_RATIO_MAX = 10.0


def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    is_weights: Tensor | None = None,
) -> PolicyLossTerms:
    """GSPO: the clipped surrogate on s = exp(mean_t log(pi_theta / pi_old)), one ratio per sequence.

    Each token carries `s` as its value and `s * grad log pi_theta(t)` as its gradient (the value is
    detached, the log-prob enters with a zero-valued `log_probs - log_probs.detach()`). Averaged over a
    sequence's tokens (seq-mean-token-mean) that is exactly the gradient of the sequence objective,
    s * mean_t grad log pi_theta(t), while per-token advantages and weights still apply.
    """
    token_log_ratio = (log_probs - old_log_probs) * mask
    seq_log_ratio = token_log_ratio.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach()[:, None]
    ratio = torch.exp(log_ratio.clamp(max=GSPO_LOG_RATIO_MAX))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    token_losses = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        token_losses = token_losses * is_weights
    approx_kl = -(log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return PolicyLossTerms(token_losses, ratio, clipped > unclipped, approx_kl)


def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    is_weights: Tensor | None = None,
) -> PolicyLossTerms:
    """CISPO (MiniMax-M1): -sg(clip(r, 1-low, 1+high)) * A * log pi_theta per token.

    The clip bounds the weight, never the gradient path: unlike PPO a token outside the trust region
    still contributes (its weight is capped), which keeps rare high-ratio tokens learning.
    """
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = ratio.detach().clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    token_losses = -advantages * weight * log_probs
    if is_weights is not None:
        token_losses = token_losses * is_weights
    is_clipped = (ratio.detach() > 1.0 + clip_ratio_high) | (ratio.detach() < 1.0 - clip_ratio_low)
    return PolicyLossTerms(token_losses, ratio, is_clipped, -log_ratio)


def configured_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: PolicyLoss,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    is_weights: Tensor | None = None,
) -> PolicyLossTerms:
    """The loss `config.loss_mode` names; `clip_ratio_low/high` are PPO's (algorithm.clip_ratio_*)."""
    if config.loss_mode == "gspo":
        return gspo_loss(log_probs, old_log_probs, advantages, mask, clip_ratio_low=config.gspo_clip_ratio_low,
                         clip_ratio_high=config.gspo_clip_ratio_high, is_weights=is_weights)  # fmt: skip
    if config.loss_mode == "cispo":
        return cispo_loss(log_probs, old_log_probs, advantages, clip_ratio_low=config.cispo_clip_ratio_low,
                          clip_ratio_high=config.cispo_clip_ratio_high, is_weights=is_weights)  # fmt: skip
    return policy_loss(log_probs, old_log_probs, advantages, clip_ratio_low=clip_ratio_low,
                       clip_ratio_high=clip_ratio_high, is_weights=is_weights,
                       clip_ratio_c=config.clip_ratio_c)  # fmt: skip
