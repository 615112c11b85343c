"""What the rollout correction did to a batch, as per-step metrics.

Every value is a mean with its weight (trained tokens, or sequences with a trained token), so the
trainer can add batches and ranks together exactly. The sampler-trainer KL is the k3 estimate of
KL(pi_rollout || pi_old) from the sampled tokens, `rho - 1 - log rho` with `rho = pi_old / pi_rollout`
(non-negative, unbiased, low variance), overall and by the staleness of each token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from psrl.rl.correction import Correction

PREFIX = "rollout_corr/"

WeightedMeans = dict[str, tuple[float, float]]  # name -> (mean, weight)


def k3(log_ratio: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(sampler || trainer) from log(pi_trainer / pi_sampler) at sampled tokens."""
    return torch.exp(log_ratio) - 1.0 - log_ratio


def token_staleness(buffer_id: int, token_versions: Tensor, versions: Tensor) -> Tensor:
    """[B, R] versions between a token's weights and the buffer (the trajectory's V_traj where a token's is unknown)."""
    known = token_versions >= 0
    return torch.where(known, buffer_id - token_versions, buffer_id - versions[:, None])


def _mean(values: Tensor, weights: Tensor) -> tuple[float, float]:
    total = float(weights.sum())
    return (float((values * weights).sum()) / total if total > 0 else 0.0), total


def correction_metrics(correction: Correction, mask: Tensor, staleness: Tensor) -> WeightedMeans:
    """Truncated and masked fractions (tokens, sequences), vetoes and the k3 KL, overall and by staleness."""
    rows = (mask.sum(dim=1) > 0).float()
    rejected = torch.zeros_like(mask) if correction.accept is None else (1.0 - correction.accept) * mask
    truncated = correction.truncated.float() * mask
    kl = k3(correction.log_ratio) * mask
    out = {
        PREFIX + "token_truncated_frac": _mean(truncated, mask),
        PREFIX + "seq_truncated_frac": _mean((truncated.sum(dim=1) > 0).float(), rows),
        PREFIX + "token_masked_frac": _mean(rejected, mask),
        PREFIX + "seq_masked_frac": _mean((rejected.sum(dim=1) > 0).float(), rows),
        PREFIX + "seq_vetoed_frac": _mean(correction.vetoed.float(), rows),
        PREFIX + "kl_k3": _mean(kl, mask),
    }
    for s in sorted({int(v) for v in staleness[mask > 0].tolist()}):
        selected = mask * (staleness == s).float()
        out[f"{PREFIX}kl_k3/staleness_{s}"] = _mean(kl, selected)
    return out
