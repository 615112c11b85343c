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
from psrl.rl.batch import Batch, Sample, collate, scatter_rows
from psrl.rl.correction import CorrectionSpec, correct, is_statistics, level_log_ratio, spec_of
from psrl.rl.correction_stats import PREFIX, correction_metrics, token_staleness
from psrl.rl.objective import compute_advantages, shaped_rewards
from psrl.trainer.forward import MicroBatch, no_grad_log_probs, no_grad_values, padded_of
from psrl.trainer.metrics import MetricSums
from psrl.trainer.packing import pack
from psrl.trainer.parallel import ParallelContext


class TrainerError(PsrlError):
    """The trainer was fed data it cannot train on (wrong buffer, malformed groups, missing log-probs)."""


@dataclass(frozen=True)
class ForwardModels:
    policy: nn.Module
    reference: nn.Module | None  # only with a KL loss
    critic: nn.Module | None  # only with GAE


@dataclass(frozen=True)
class PendingForward:
    """One micro-batch's no-grad forwards, launched; their results are on their way to the host.

    The micro-batch loop launches every forward before it reads any result back (`finish_forwards`):
    reading one back waits for the device, and the device then idles while the host prepares the next
    micro-batch. The correction and its statistics run on the host copies (small [B, R] tensors).
    """

    samples: Sequence[Sample]
    batch: Batch  # the padded per-token tensors, on the host
    results: dict[str, Tensor]  # old_log_probs, ref_log_probs, values (as computed), on the host
    copied: torch.cuda.Event | None  # recorded after the copies to the host; None: already there
    # the policy's forward was left to the update (`fuse_old_log_probs`): no old log-probs or correction here
    policy_deferred: bool = False


def run_forwards(
    samples: Sequence[Sample],
    models: ForwardModels,
    algorithm: Algorithm,
    *,
    temperature: float,
    pad_token_id: int,
    parallel: ParallelContext,
    packing: bool = False,
    share_prompts: bool = False,
    with_policy: bool = True,
) -> PendingForward:
    """Launch the forwards of one micro-batch (packed when `packing`: the models then run varlen
    attention, see `psrl.trainer.packing`): old log-probs, reference log-probs and values as needed.
    `with_policy=False`: the update's own forward will give the old log-probs (same weights)."""
    host: MicroBatch = (
        pack(samples, pad_token_id, share_prompts=share_prompts) if packing else collate(samples, pad_token_id)
    )
    batch = padded_of(host)
    correction = algorithm.rollout_correction
    if (correction.bypass_mode or spec_of(correction).is_active) and not batch.has_rollout_log_probs:
        raise TrainerError("rollout correction needs the engine's log-probs, and a trajectory came without them")
    micro = host.to(parallel.device)
    results = {}
    deferred = not with_policy and not correction.bypass_mode
    if not correction.bypass_mode and with_policy:
        # the policy stays in eval mode from load_policy (checkpointed layers alone carry training=True)
        results["old_log_probs"] = no_grad_log_probs(models.policy, micro, temperature)
    if models.reference is not None:
        results["ref_log_probs"] = no_grad_log_probs(models.reference, micro, temperature)
    if models.critic is not None:
        results["values"] = no_grad_values(models.critic, micro)
    if parallel.device.type != "cuda":
        return PendingForward(samples, batch, {k: v.float() for k, v in results.items()}, None, deferred)
    copies = {name: _host_copy(value) for name, value in results.items()}
    copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
    copied.record()
    return PendingForward(samples, batch, copies, copied, deferred)


def _host_copy(values: Tensor) -> Tensor:
    out = torch.empty(values.shape, dtype=torch.float32, pin_memory=True)
    return out.copy_(values.detach().float(), non_blocking=True)


def finish_forwards(
    pending: PendingForward, algorithm: Algorithm, *, sums: MetricSums, buffer_id: int = 0, max_staleness: int = 0
) -> None:
    """Fill `old_log_probs`, `is_weights`, `rs_accept`, `ref_log_probs` and `values` of a launched micro-batch."""
    if pending.copied is not None:
        pending.copied.synchronize()
    samples, batch, results = pending.samples, pending.batch, pending.results
    if not pending.policy_deferred:
        bypass = algorithm.rollout_correction.bypass_mode
        old_log_probs = batch.rollout_log_probs if bypass else results["old_log_probs"]
        policy_stage(samples, batch, old_log_probs, algorithm, sums=sums, buffer_id=buffer_id,
                     max_staleness=max_staleness)  # fmt: skip
    for name in ("ref_log_probs", "values"):
        if name in results:
            scatter_rows(results[name], samples, name)


def policy_stage(
    samples: Sequence[Sample],
    batch: Batch,
    old_log_probs: Tensor,
    algorithm: Algorithm,
    *,
    sums: MetricSums,
    buffer_id: int,
    max_staleness: int,
) -> dict[str, Tensor]:
    """Store the old log-probs and the rollout correction's weights and acceptance on `samples` (its
    statistics in `sums`); returns those `[B, R]` tensors by field name, on `batch`'s device."""
    correction = algorithm.rollout_correction
    scatter_rows(old_log_probs, samples, "old_log_probs")
    fields = {"old_log_probs": old_log_probs}
    if batch.has_rollout_log_probs and not correction.bypass_mode:
        staleness = token_staleness(buffer_id, batch.token_versions, batch.versions).clamp(0, max_staleness)
        fields |= _correct(samples, batch, old_log_probs, spec_of(correction), staleness, sums, max_staleness)
    if batch.has_rollout_log_probs:
        _add_mismatch(sums, old_log_probs, batch.rollout_log_probs, batch.response_mask)
    return fields


def _correct(
    samples: Sequence[Sample],
    batch: Batch,
    old_log_probs: Tensor,
    spec: CorrectionSpec,
    staleness: Tensor,
    sums: MetricSums,
    max_staleness: int,
) -> dict[str, Tensor]:
    """Store the correction's weights and acceptance on the samples (and return them), and what it
    did in `sums`.

    The metrics are measured without a correction too (the uncorrected run's KL is the baseline);
    every rank declares the same staleness keys, so those with no tokens on a rank still reduce."""
    mask = batch.response_mask
    result = correct(old_log_probs, batch.rollout_log_probs, mask, spec)
    fields = {}
    if result.is_weights is not None and spec.is_level is not None:
        scatter_rows(result.is_weights, samples, "is_weights")
        fields["is_weights"] = result.is_weights
        raw = torch.exp(level_log_ratio(result.log_ratio, mask, spec.is_level))  # the weight before truncation
        _add_is_stats(sums, is_statistics(raw, mask, spec.is_upper, result.log_ratio), float(mask.sum()))
    if result.accept is not None:
        scatter_rows(result.accept, samples, "rs_accept")
        fields["rs_accept"] = result.accept
    for name, (mean, weight) in correction_metrics(result, mask, staleness).items():
        sums.add(name, mean, weight)
    for s in range(max_staleness + 1):
        sums.add_sparse(f"{PREFIX}kl_k3/staleness_{s}", 0.0, 0.0)
    sums.add_pooled(PREFIX + "ratio", torch.exp(result.log_ratio[mask > 0]))
    return fields


def advantage_stage(
    samples: Sequence[Sample],
    algorithm: Algorithm,
    *,
    pad_token_id: int,
    parallel: ParallelContext,
    max_response_length: int = 0,
    sums: MetricSums | None = None,
) -> None:
    """Fill `advantages` (and `returns` for GAE / REINFORCE++) of this rank's samples, after the
    configured reward shaping (DAPO's overlong penalty, whose mean goes to `sums`)."""
    # only the critic's values feed an advantage (a first mini-batch's samples have no old log-probs yet)
    inputs = [Sample(s.trajectory, {k: v for k, v in s.fields.items() if k == "values"}) for s in samples]
    batch, penalty = shaped_rewards(collate(inputs, pad_token_id), algorithm, max_response_length)
    if penalty is not None and sums is not None:
        sums.add("reward/overlong_penalty_mean", float(penalty.mean()), weight=float(penalty.numel()))
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
