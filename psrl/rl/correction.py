"""Rollout correction: importance weights and rejection between the engine's and the trainer's policy.

The engine samples with pi_rollout (possibly several weight versions within one trajectory under
partial rollout); the trainer's PPO anchor is pi_old, recomputed with the weights of the buffer's
version. Everything here is a function of the per-token log-ratio `log(pi_old / pi_rollout)`, taken
at one of three levels:

* token: each token's own ratio;
* sequence: the product of the response's token ratios (the exact sequence likelihood ratio,
  high variance on long responses), broadcast to its tokens;
* geometric: their geometric mean (a per-token average, length-independent), broadcast.

Two corrections, combinable:

* importance weights (`rollout_is`): the ratio truncated to `[lower, upper]` (TIS), detached (the
  weight corrects the sampling distribution, it is not optimised);
* rejection (`rollout_rs`, IcePop at token level, MIS at sequence level): a 0/1 mask that drops
  what leaves the band `[lower, upper]`, plus the veto of a whole response with any token ratio
  below a threshold.

Modes (`algorithm.rollout_correction`): decoupled (default; old log-probs recomputed, three
policies) or bypass (`bypass_mode=True`: old log-probs are the engine's, the PPO ratio is then
`pi_theta / pi_rollout` itself, and no separate weight applies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from psrl.config.training import RolloutCorrection
from psrl.rl.losses import LOG_RATIO_CLAMP

Level = Literal["token", "sequence", "geometric"]


@dataclass(frozen=True)
class ImportanceWeights:
    weights: Tensor  # [B, R], truncated, zero outside the mask, detached
    stats: dict[str, float]


@dataclass(frozen=True)
class CorrectionSpec:
    """The configured correction (see `psrl.config.training.RolloutCorrection`)."""

    is_level: Level | None = None
    is_upper: float = 2.0
    is_lower: float | None = None
    rs_level: Level | None = None
    rs_upper: float | None = None
    rs_lower: float | None = None  # None = 1 / rs_upper
    veto: float | None = None

    @property
    def is_active(self) -> bool:
        return self.is_level is not None or self.rs_level is not None or self.veto is not None

    def describe(self) -> str:
        """One line for the staleness certificate, e.g. ``is=token[-,2];rs=token[0.5,5];veto=0.0001``."""
        parts = []
        if self.is_level is not None:
            low = "-" if self.is_lower is None else f"{self.is_lower:g}"
            parts.append(f"is={self.is_level}[{low},{self.is_upper:g}]")
        if self.rs_level is not None and self.rs_upper is not None:
            parts.append(f"rs={self.rs_level}[{rs_lower(self):g},{self.rs_upper:g}]")
        if self.veto is not None:
            parts.append(f"veto={self.veto:g}")
        return ";".join(parts) or "none"


def spec_of(config: RolloutCorrection) -> CorrectionSpec:
    """The correction the config asks for; bypass mode has none (the old policy is the rollout policy)."""
    if config.bypass_mode:
        return CorrectionSpec()
    return CorrectionSpec(
        is_level=config.rollout_is,
        is_upper=config.rollout_is_threshold,
        is_lower=config.rollout_is_threshold_lower,
        rs_level=config.rollout_rs,
        rs_upper=config.rollout_rs_threshold,
        rs_lower=config.rollout_rs_threshold_lower,
        veto=config.rollout_token_veto_threshold,
    )


def rs_lower(spec: CorrectionSpec) -> float:
    if spec.rs_lower is not None:
        return spec.rs_lower
    return 1.0 / spec.rs_upper if spec.rs_upper else 0.0


@dataclass(frozen=True)
class Correction:
    log_ratio: Tensor  # [B, R] log(pi_old / pi_rollout), clamped, 0 outside the mask, detached
    is_weights: Tensor | None  # [B, R] truncated weights, 0 outside the mask; None without rollout_is
    accept: Tensor | None  # [B, R] 1 = kept, 0 = rejected or vetoed (0 outside the mask); None without rejection
    truncated: Tensor  # [B, R] bool: the weight was cut at a bound
    vetoed: Tensor  # [B] bool: the response was vetoed


def token_log_ratio(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> Tensor:
    return (old_log_probs - rollout_log_probs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * mask


def level_log_ratio(log_ratio: Tensor, mask: Tensor, level: Level) -> Tensor:
    """`[B, R]` log-ratio at `level`, each row's sequence value broadcast to its positions."""
    if level == "token":
        return log_ratio
    total = (log_ratio * mask).sum(dim=1, keepdim=True)
    if level == "geometric":
        total = total / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return total.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).expand_as(log_ratio)


def truncated_weights(level_ratio: Tensor, lower: float | None, upper: float) -> tuple[Tensor, Tensor]:
    """(ratio clamped to [lower, upper], bool where a bound cut it); a ratio exactly at a bound is not cut."""
    ratio = torch.exp(level_ratio)
    low = 0.0 if lower is None else lower
    return ratio.clamp(min=low, max=upper), (ratio > upper) | (ratio < low)


def band_mask(level_ratio: Tensor, lower: float, upper: float) -> Tensor:
    """1 where the ratio lies inside the closed band [lower, upper], else 0."""
    ratio = torch.exp(level_ratio)
    return ((ratio >= lower) & (ratio <= upper)).float()


def veto_rows(log_ratio: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """[B] bool: some trained token's ratio is below `threshold`."""
    return ((torch.exp(log_ratio) < threshold) & (mask > 0)).any(dim=1)


def correct(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, spec: CorrectionSpec) -> Correction:
    """Importance weights and acceptance mask of a batch under `spec`."""
    log_ratio = token_log_ratio(old_log_probs, rollout_log_probs, mask)
    weights = None
    truncated = torch.zeros_like(mask, dtype=torch.bool)
    if spec.is_level is not None:
        level = level_log_ratio(log_ratio, mask, spec.is_level)
        weights, truncated = truncated_weights(level, spec.is_lower, spec.is_upper)
        weights, truncated = weights * mask, truncated & (mask > 0)
    accept = None
    vetoed = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    if spec.rs_level is not None and spec.rs_upper is not None:
        level = level_log_ratio(log_ratio, mask, spec.rs_level)
        accept = band_mask(level, rs_lower(spec), spec.rs_upper) * mask
    if spec.veto is not None:
        vetoed = veto_rows(log_ratio, mask, spec.veto)
        accept = (mask if accept is None else accept) * (~vetoed).float()[:, None]
    return Correction(log_ratio, weights, accept, truncated, vetoed)


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
