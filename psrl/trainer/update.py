"""One optimizer step per mini-batch, accumulated over micro-batches, for the actor and the critic.

Losses are normalised by the *whole* mini-batch's trained tokens / sequences (every rank knows
them, since every rank receives the full buffer), so the accumulated gradient equals that of one
batch with the mini-batch's data, whatever the micro-batch size or the number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from psrl.config.training import Algorithm
from psrl.rl.batch import Batch, Sample, collate
from psrl.rl.losses import aggregate, value_loss
from psrl.rl.objective import Denominators, actor_loss
from psrl.rl.trajectory import Trajectory
from psrl.trainer.checkpoint import Trainable
from psrl.trainer.forward import MicroBatch, compute_precision, padded_of, response_log_probs, response_values
from psrl.trainer.memory import CheckpointPolicy
from psrl.trainer.metrics import MetricSums
from psrl.trainer.packing import PackedBatch, micro_batch_count, pack, plan_packed, sample_tokens
from psrl.trainer.parallel import ParallelContext
from psrl.trainer.stages import TrainerError, policy_stage


@dataclass(frozen=True)
class UpdateSettings:
    micro_batch_size: int  # samples per forward/backward on one rank
    grad_clip: float  # 0 = no clipping
    temperature: float
    pad_token_id: int
    # actor.use_dynamic_bsz: micro-batches of at most this many tokens (real ones when packed, else padded)
    max_tokens_per_micro_batch: int | None = None
    compute_dtype: torch.dtype = torch.float32  # actor.compute_dtype: autocast of the forward
    packing: bool = False  # actor.packing: padding-free micro-batches (psrl.trainer.packing)
    share_prompts: bool = False  # actor.share_prompts as it applies here: each prompt once per micro-batch


def build_micro_batch(samples: Sequence[Sample], settings: UpdateSettings, device: torch.device) -> MicroBatch:
    """Samples as one micro-batch on `device`: packed or padded, as configured."""
    if settings.packing:
        return pack(samples, settings.pad_token_id, share_prompts=settings.share_prompts).to(device)
    return collate(samples, settings.pad_token_id).to(device)


def denominators(trajectories: Sequence[Trajectory], token_norm: float | None = None) -> Denominators:
    """Trained tokens and sequences of a whole mini-batch (every rank's share), and the constant
    normaliser of seq-mean-token-sum-norm."""
    return Denominators(
        num_tokens=float(sum(t.num_trained_tokens for t in trajectories)),
        num_seqs=float(len(trajectories)),
        token_norm=token_norm,
    )


def micro_batches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    return [list(samples[i : i + size]) for i in range(0, len(samples), size)]


def padded_tokens(samples: Sequence[Sample]) -> int:
    """Tokens of the collated batch: rows x (longest prompt + longest response)."""
    prompt = max(len(s.trajectory.prompt_token_ids) for s in samples)
    response = max([1, *(s.trajectory.num_response_tokens for s in samples)])
    return len(samples) * (prompt + response)


def token_budget_batches(samples: Sequence[Sample], max_tokens: int) -> list[list[Sample]]:
    """Samples packed, shortest first, while the padded batch stays within `max_tokens` (a longer
    sample goes alone). Sorting keeps rows of similar length together: with long-tail responses a
    micro-batch in arrival order is mostly padding (one 4k-token response pads its neighbours of a
    few hundred). The losses are normalised by the whole mini-batch, so any split gives the same step."""
    parts: list[list[Sample]] = []
    for sample in sorted(samples, key=sample_tokens):
        if parts and padded_tokens([*parts[-1], sample]) <= max_tokens:
            parts[-1].append(sample)
        else:
            parts.append([sample])
    return parts


def split_to_count(parts: list[list[Sample]], count: int) -> list[list[Sample]]:
    """Halve the largest micro-batches until there are `count` (data-parallel ranks must run as many
    forwards as each other); stops when every micro-batch holds one sample."""
    parts = [list(p) for p in parts]
    while len(parts) < count:
        largest = max(range(len(parts)), key=lambda i: len(parts[i]))
        if len(parts[largest]) < 2:
            break
        half = len(parts[largest]) // 2
        parts[largest : largest + 1] = [parts[largest][:half], parts[largest][half:]]
    return parts


def plan_micro_batches(
    own: Sequence[Sample], settings: UpdateSettings, parallel: ParallelContext
) -> list[list[Sample]]:
    """This rank's micro-batches, as many on every rank: token-balanced when packed
    (`psrl.trainer.packing.plan_packed`), else fixed sample counts or padded-token budgets."""
    if settings.packing:
        budget, share = settings.max_tokens_per_micro_batch, settings.share_prompts
        count = micro_batch_count(own, max_tokens=budget, micro_batch_size=settings.micro_batch_size,
                                  share_prompts=share)  # fmt: skip
        return plan_packed(own, _most_over_ranks(count, parallel), max_tokens=budget, share_prompts=share)
    if settings.max_tokens_per_micro_batch is None:
        return micro_batches(own, settings.micro_batch_size)
    parts = token_budget_batches(own, settings.max_tokens_per_micro_batch)
    if parallel.world_size > 1:
        parts = split_to_count(parts, _most_over_ranks(len(parts), parallel))
    return parts


def _most_over_ranks(count: int, parallel: ParallelContext) -> int:
    """The largest `count` of any rank (one all-reduce; the count itself on one rank)."""
    if parallel.world_size == 1:
        return count
    counts = torch.zeros(parallel.world_size, dtype=torch.float64, device=parallel.device)
    counts[parallel.rank] = count
    return int(parallel.all_reduce_sum(counts).max())


# a micro-batch (and its samples): its loss and metric contributions (floats, or tensors the step reads
# back once at its end)
LossOfBatch = Callable[[MicroBatch, Sequence[Sample]], tuple[Tensor, Mapping[str, float | Tensor]]]


@dataclass(frozen=True)
class DeferredPolicyStage:
    """Where the samples' old log-probs come from the update's own forward (`actor.fuse_old_log_probs`):
    what the policy stage needs besides the micro-batch."""

    buffer_id: int
    max_staleness: int


def actor_step(
    policy: Trainable,
    own: Sequence[Sample],
    scale: Denominators,
    algorithm: Algorithm,
    settings: UpdateSettings,
    parallel: ParallelContext,
    sums: MetricSums,
    checkpointing: CheckpointPolicy | None = None,
    deferred: DeferredPolicyStage | None = None,
) -> None:
    """One optimizer step of the policy on this rank's share of a mini-batch. Samples without old
    log-probs take them from this forward, detached (`deferred`: the weights are still those the
    no-grad forward would have used), with the rollout correction computed on them."""

    def loss_of(micro: MicroBatch, part: Sequence[Sample]) -> tuple[Tensor, dict[str, Tensor]]:
        log_probs, entropy = response_log_probs(
            policy.model, micro, temperature=settings.temperature, with_entropy=True
        )
        batch = padded_of(micro)
        if "old_log_probs" not in batch.fields:
            _policy_stage_here(part, batch, log_probs, algorithm, sums, deferred)
        return actor_loss(log_probs, entropy, batch, algorithm, scale)

    _accumulated_step(policy, own, settings, parallel, sums, loss_of, "actor", checkpointing)


def _policy_stage_here(
    part: Sequence[Sample],
    batch: Batch,
    log_probs: Tensor,
    algorithm: Algorithm,
    sums: MetricSums,
    deferred: DeferredPolicyStage | None,
) -> None:
    if deferred is None:
        raise TrainerError("a sample reached the update without old log-probs")
    old = log_probs.detach().float()
    fields = policy_stage(part, batch, old, algorithm, sums=sums, buffer_id=deferred.buffer_id,
                          max_staleness=deferred.max_staleness)  # fmt: skip
    batch.fields.update({name: values.float() for name, values in fields.items()})


def critic_step(
    critic: Trainable,
    own: Sequence[Sample],
    scale: Denominators,
    algorithm: Algorithm,
    settings: UpdateSettings,
    parallel: ParallelContext,
    sums: MetricSums,
    *,
    clip_range: float,
    vf_coef: float,
    checkpointing: CheckpointPolicy | None = None,
) -> None:
    """One optimizer step of the critic on this rank's share of a mini-batch."""

    def loss_of(micro: MicroBatch, part: Sequence[Sample]) -> tuple[Tensor, Mapping[str, float | Tensor]]:
        values = response_values(critic.model, micro)
        batch = padded_of(micro)
        losses, is_clipped = value_loss(values, batch.fields["values"], batch.fields["returns"], clip_range=clip_range)
        loss = vf_coef * aggregate(losses, batch.response_mask, algorithm.loss_agg_mode, **_scale(scale))
        metrics = {  # tensors: read back once per step, not per micro-batch
            "critic/vf_loss": loss.detach() / vf_coef,
            "critic/vf_clip_frac": _token_share(is_clipped.float(), batch, scale),
            "critic/values_mean": _token_share(values.detach(), batch, scale),
        }
        return loss, metrics

    _accumulated_step(critic, own, settings, parallel, sums, loss_of, "critic", checkpointing)


def _accumulated_step(
    trainable: Trainable,
    own: Sequence[Sample],
    settings: UpdateSettings,
    parallel: ParallelContext,
    sums: MetricSums,
    loss_of: LossOfBatch,
    prefix: str,
    checkpointing: CheckpointPolicy | None,
) -> None:
    """Zero, accumulate gradients over micro-batches (syncing ranks on the last), clip and step."""
    checkpointing = checkpointing or CheckpointPolicy(trainable.model, "off", settings.compute_dtype)
    trainable.optimizer.zero_grad(set_to_none=True)
    parts = plan_micro_batches(own, settings, parallel)
    contributions: dict[str, float | Tensor] = {}
    for index, part in enumerate(parts):
        micro = build_micro_batch(part, settings, parallel.device)
        with parallel.gradient_sync(trainable.model, enabled=index == len(parts) - 1):
            with (
                compute_precision(parallel.device, settings.compute_dtype),
                checkpointing.around(_tokens_of(micro), parallel.device),
            ):
                loss, metrics = loss_of(micro, part)
            _backward(loss * parallel.loss_scale)
        for name, value in metrics.items():
            contributions[name] = contributions.get(name, 0.0) + value
    for name, value in zip(contributions, _read_back(list(contributions.values())), strict=True):
        sums.add_share(name, value, 1.0 / parallel.world_size)
    _finish_step(trainable, settings.grad_clip, sums, prefix)


def _read_back(values: list[float | Tensor]) -> list[float]:
    """The step's metric contributions as floats, with one device-to-host copy for all the tensors."""
    tensors = [v.detach().float().reshape(()) for v in values if isinstance(v, Tensor)]
    read = iter(torch.stack(tensors).tolist() if tensors else [])
    return [next(read) if isinstance(v, Tensor) else float(v) for v in values]


def _tokens_of(micro: MicroBatch) -> int:
    """Tokens the forward runs: the packed row, or every padded row's full width."""
    return micro.num_tokens if isinstance(micro, PackedBatch) else int(micro.input_ids.numel())


def _finish_step(trainable: Trainable, grad_clip: float, sums: MetricSums, prefix: str) -> None:
    params = [p for p in trainable.model.parameters() if p.requires_grad]
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = _to_float(grad_norm)
    sums.add(f"{prefix}/grad_norm", norm)
    sums.add(f"{prefix}/lr", float(trainable.optimizer.param_groups[0]["lr"]))
    trainable.optimizer.step()


def _scale(scale: Denominators) -> dict[str, float | None]:
    return scale.scale()


def _token_share(values: Tensor, batch: Batch, scale: Denominators) -> Tensor:
    return aggregate(values, batch.response_mask, "token-mean", num_tokens=scale.num_tokens)


def _to_float(value: Tensor) -> float:
    full = getattr(value, "full_tensor", None)
    return float(full() if full is not None else value)


def _backward(loss: Tensor) -> None:
    torch.autograd.backward([loss])
