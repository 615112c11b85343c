"""Rollout correction: token-level importance sampling between the engine and the trainer.

The engine samples with pi_rollout (possibly several weight versions within one trajectory under
partial rollout); the trainer's PPO anchor is pi_old, recomputed with the weights of the buffer's
version. Each token's loss is weighted by `w = pi_old / pi_rollout`, truncated at the threshold
(TIS: `min(w, threshold)`), and detached (the weight corrects the sampling distribution, it is not
optimised).

Two modes (`algorithm.rollout_correction`):

* decoupled (default): old log-probs are recomputed; three policies (rollout, old, current).
* bypass (`bypass_mode=True`): old log-probs are the engine's; the PPO ratio is then
  `pi_theta / pi_rollout` itself and no separate weight is applied (two policies).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from psrl.rl.losses import LOG_RATIO_CLAMP


@dataclass(frozen=True)
class ImportanceWeights:
    weights: Tensor  # [B, R], truncated, zero outside the mask, detached
    stats: dict[str, float]


def token_is_weights(
    old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, threshold: float
) -> ImportanceWeights:
    """Truncated per-token importance weights and their statistics (before truncation)."""
    log_ratio = (old_log_probs - rollout_log_probs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    raw = torch.exp(log_ratio)
    weights = raw.clamp(max=threshold) * mask
    return ImportanceWeights(weights, is_statistics(raw, mask, threshold, log_ratio))


def is_statistics(raw: Tensor, mask: Tensor, threshold: float, log_ratio: Tensor) -> dict[str, float]:
    selected = mask > 0
    if not bool(selected.any()):
        return {}
    values = raw[selected]
    return {
        "rollout_is/mean": float(values.mean()),
        "rollout_is/max": float(values.max()),
        "rollout_is/min": float(values.min()),
        "rollout_is/truncated_frac": float((values > threshold).float().mean()),
        "rollout_is/log_prob_abs_diff": float(log_ratio[selected].abs().mean()),
    }
