"""The configured algorithm as two functions: advantages for a batch, and the actor loss of a micro-batch."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

from psrl.config.training import Algorithm
from psrl.rl.advantages import (
    Moments,
    gae_advantages,
    grpo_advantages,
    local_moments,
    reinforce_pp_advantages,
    rloo_advantages,
    token_level_rewards,
)
from psrl.rl.batch import Batch
from psrl.rl.losses import aggregate, kl_penalty
from psrl.rl.policy_losses import configured_policy_loss
from psrl.rl.shaping import overlong_penalty


@dataclass(frozen=True)
class Denominators:
    """Trained tokens and sequences of a whole mini-batch (all micro-batches, all ranks)."""

    num_tokens: float
    num_seqs: float
    token_norm: float | None = None  # the constant of seq-mean-token-sum-norm

    def scale(self) -> dict[str, float | None]:
        return {"num_tokens": self.num_tokens, "num_seqs": self.num_seqs, "token_norm": self.token_norm}


def shaped_rewards(batch: Batch, algorithm: Algorithm, max_response_length: int) -> tuple[Batch, Tensor | None]:
    """(the batch with DAPO's overlong penalty added to its rewards, the penalties) or (batch, None) when off."""
    buffer = algorithm.overlong_buffer
    if not buffer.enable:
        return batch, None
    penalty = overlong_penalty(batch.token_mask.sum(dim=1), max_length=max_response_length, buffer_len=buffer.len,
                               penalty_factor=buffer.penalty_factor)  # fmt: skip
    return replace(batch, rewards=batch.rewards + penalty), penalty


def compute_advantages(
    batch: Batch, algorithm: Algorithm, moments: Moments = local_moments
) -> tuple[Tensor, Tensor | None]:
    """(advantages, returns or None) as `[B, R]`; GAE needs `batch.fields["values"]`.

    GRPO needs whole groups in `batch`; GAE and REINFORCE++ whiten over the batch, and `moments`
    lets a data-parallel caller whiten over every rank's share instead.
    """
    if algorithm.adv_estimator == "grpo":
        advantages = grpo_advantages(
            batch.rewards, batch.group_index, batch.response_mask, norm_by_std=algorithm.norm_adv_by_std_in_grpo
        )
        return advantages, None
    if algorithm.adv_estimator == "rloo":
        return rloo_advantages(batch.rewards, batch.group_index, batch.response_mask), None
    token_rewards = token_level_rewards(batch.rewards, batch.token_mask)
    if algorithm.adv_estimator == "gae":
        values = batch.fields["values"]
        return gae_advantages(
            token_rewards,
            values,
            batch.token_mask,
            batch.response_mask,
            gamma=algorithm.gamma,
            lam=algorithm.lam,
            moments=moments,
        )
    return reinforce_pp_advantages(token_rewards, batch.response_mask, gamma=algorithm.gamma, moments=moments)


def token_weights(batch: Batch) -> Tensor | None:
    """The rollout correction's weight of each token: truncated IS weight x acceptance (None = all 1)."""
    weights = batch.fields.get("is_weights")
    accept = batch.fields.get("rs_accept")
    if weights is None or accept is None:
        return weights if accept is None else accept
    return weights * accept


def actor_loss(
    log_probs: Tensor, entropy: Tensor | None, batch: Batch, algorithm: Algorithm, denominators: Denominators
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one micro-batch, scaled so that summing over the mini-batch gives the mini-batch loss.

    The returned metrics are contributions with the same scaling (sum them over micro-batches and
    ranks to get mini-batch means), as detached 0-d tensors: reading them back is one host sync per
    mini-batch, not one per micro-batch and metric.
    """
    mask = batch.response_mask
    mode = algorithm.loss_agg_mode
    scale = denominators.scale()
    terms = configured_policy_loss(
        log_probs,
        batch.fields["old_log_probs"],
        batch.fields["advantages"],
        mask,
        algorithm.policy_loss,
        clip_ratio_low=algorithm.clip_ratio_low,
        clip_ratio_high=algorithm.clip_ratio_high,
        is_weights=token_weights(batch),
    )
    pg_loss = aggregate(terms.token_losses, mask, mode, **scale)
    loss = pg_loss
    metrics = {
        "actor/pg_loss": pg_loss.detach(),
        "actor/clip_frac": aggregate(terms.is_clipped.float(), mask, "token-mean", **scale),
        "actor/ppo_kl": aggregate(terms.approx_kl.detach(), mask, "token-mean", **scale),
    }
    if entropy is not None:
        entropy_term = aggregate(entropy, mask, mode, **scale)
        metrics["actor/entropy"] = aggregate(entropy.detach(), mask, "token-mean", **scale)
        if algorithm.entropy_coeff > 0:
            loss = loss - algorithm.entropy_coeff * entropy_term
    if algorithm.kl_loss_coef > 0:
        kl = kl_penalty(log_probs, batch.fields["ref_log_probs"], algorithm.kl_loss_type)
        kl_term = aggregate(kl, mask, mode, **scale)
        loss = loss + algorithm.kl_loss_coef * kl_term
        metrics["actor/kl_loss"] = aggregate(kl.detach(), mask, "token-mean", **scale)
    return loss, metrics
