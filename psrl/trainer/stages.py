"""The two stages before an update: per-sample forwards, and the batch-coupled advantage.

* Per-sample (old log-probs, importance weights, reference log-probs, values): each sample's
  result depends only on the sample and the current weights, so it can run on a chunk as soon as
  it arrives. It runs in *forward units* of whole prompt groups whose boundaries depend only on
  the groups' order in the buffer, never on how the buffer was chunked; that is what makes
  `overlap_scope=recompute` bit-identical to `granularity=none`.
* Advantage: needs the whole batch (GRPO: whole groups; GAE and REINFORCE++: whitening).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from psrl.config.training import Algorithm
from psrl.errors import PsrlError
from psrl.rl.advantages import Moments
from psrl.rl.batch import Sample, collate, scatter_rows
from psrl.rl.correction import token_is_weights
from psrl.rl.objective import compute_advantages
from psrl.trainer.forward import no_grad_log_probs, no_grad_values
from psrl.trainer.metrics import MetricSums
from psrl.trainer.parallel import ParallelContext


class TrainerError(PsrlError):
    """The trainer was fed data it cannot train on (wrong buffer, malformed groups, missing log-probs)."""


@dataclass(frozen=True)
class ForwardModels:
    policy: nn.Module
    reference: nn.Module | None  # only with a KL loss
    critic: nn.Module | None  # only with GAE


def per_sample_stage(
    samples: Sequence[Sample],
    models: ForwardModels,
    algorithm: Algorithm,
    *,
    temperature: float,
    pad_token_id: int,
    parallel: ParallelContext,
    sums: MetricSums,
) -> None:
    """Fill `old_log_probs`, `is_weights`, `ref_log_probs` and `values` of one forward unit."""
    batch = collate(samples, pad_token_id).to(parallel.device)
    correction = algorithm.rollout_correction
    needs_engine = correction.bypass_mode or correction.rollout_is == "token"
    if needs_engine and not batch.has_rollout_log_probs:
        raise TrainerError("rollout correction needs the engine's log-probs, and a trajectory came without them")
    if correction.bypass_mode:
        old_log_probs = batch.rollout_log_probs
    else:
        # the policy stays in eval mode from load_policy (checkpointed layers alone carry training=True)
        old_log_probs = no_grad_log_probs(models.policy, batch, temperature)
    scatter_rows(old_log_probs, samples, "old_log_probs")
    if correction.rollout_is == "token" and not correction.bypass_mode:
        result = token_is_weights(
            old_log_probs, batch.rollout_log_probs, batch.response_mask, correction.rollout_is_threshold
        )
        scatter_rows(result.weights, samples, "is_weights")
        _add_is_stats(sums, result.stats, float(batch.response_mask.sum()))
    if batch.has_rollout_log_probs:
        _add_mismatch(sums, old_log_probs, batch.rollout_log_probs, batch.response_mask)
    if models.reference is not None:
        scatter_rows(no_grad_log_probs(models.reference, batch, temperature), samples, "ref_log_probs")
    if models.critic is not None:
        scatter_rows(no_grad_values(models.critic, batch), samples, "values")


def advantage_stage(
    samples: Sequence[Sample], algorithm: Algorithm, *, pad_token_id: int, parallel: ParallelContext
) -> None:
    """Fill `advantages` (and `returns` for GAE / REINFORCE++) of this rank's samples."""
    batch = collate(samples, pad_token_id)
    advantages, returns = compute_advantages(batch, algorithm, moments=_cross_rank_moments(parallel))
    scatter_rows(advantages, samples, "advantages")
    if returns is not None:
        scatter_rows(returns, samples, "returns")


def _cross_rank_moments(parallel: ParallelContext) -> Moments:
    def moments(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        stats = torch.stack([(values * mask).sum(), mask.sum()]).double()
        total, count = parallel.all_reduce_sum(stats.to(parallel.device)).cpu()
        mean = (total / count.clamp(min=1)).float()
        squares = torch.stack([(((values - mean) * mask) ** 2).sum().double()])
        var = parallel.all_reduce_sum(squares.to(parallel.device)).cpu()[0] / (count - 1).clamp(min=1)
        return mean, var.float()

    return moments


def _add_is_stats(sums: MetricSums, stats: dict[str, float], num_tokens: float) -> None:
    for name in ("rollout_is/mean", "rollout_is/truncated_frac", "rollout_is/log_prob_abs_diff"):
        sums.add(name, stats.get(name, 0.0), weight=num_tokens if name in stats else 0.0)  # same keys on every rank
    sums.add_max("rollout_is/max", stats.get("rollout_is/max", 1.0))
    sums.add_min("rollout_is/min", stats.get("rollout_is/min", 1.0))


def _add_mismatch(sums: MetricSums, old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> None:
    """How far the engine's log-probs are from the trainer's (a training/inference mismatch check)."""
    count = float(mask.sum())
    diff = ((old_log_probs - rollout_log_probs).abs() * mask).sum() / max(count, 1.0)
    sums.add("rollout/log_prob_abs_diff", float(diff), weight=count)
