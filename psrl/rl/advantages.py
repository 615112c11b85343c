"""Advantage estimators: GRPO, RLOO, GAE and REINFORCE++ (outcome rewards on `[B, R]` response tensors).

Conventions (those of veRL, so results can be compared):

* The outcome reward of a trajectory sits on its last real response token (`token_level_rewards`).
* GRPO: `(r - mean_group) / (std_group + eps)` with the unbiased std, or `r - mean_group` when
  `norm_by_std` is off; a group of one has advantage 0 (it carries no comparison).
* RLOO: `r_i - mean_{j != i} r_j` over the group, i.e. `n / (n - 1) * (r_i - mean_group)`; a group
  of one has advantage 0.
* GAE: the usual backward recursion over response tokens with a zero value after the last token;
  returns = advantages + values; advantages are then whitened over the batch's trained tokens.
* REINFORCE++: discounted returns of the token rewards, whitened over the batch's trained tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

WHITEN_EPS = 1e-8
Moments = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (values, mask) -> (mean, unbiased variance)


def token_level_rewards(rewards: Tensor, token_mask: Tensor) -> Tensor:
    """Put each row's scalar reward on its last real response token."""
    out = torch.zeros_like(token_mask, dtype=torch.float32)
    lengths = token_mask.sum(dim=1).long()
    rows = torch.nonzero(lengths > 0).squeeze(1)
    out[rows, lengths[rows] - 1] = rewards[rows].float()
    return out


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def local_moments(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, unbiased variance) of the masked entries."""
    mean = masked_mean(values, mask)
    centred = (values - mean) * mask
    return mean, (centred**2).sum() / (mask.sum() - 1).clamp(min=1)


def masked_whiten(values: Tensor, mask: Tensor, moments: Moments = local_moments) -> Tensor:
    """Zero mean, unit variance over the masked entries (`moments` may reduce across ranks)."""
    mean, var = moments(values, mask)
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS)


def grpo_advantages(
    rewards: Tensor, group_index: Tensor, response_mask: Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    num_groups = int(group_index.max()) + 1
    rewards = rewards.float()
    counts = torch.zeros(num_groups).index_add_(0, group_index, torch.ones_like(rewards))
    means = torch.zeros(num_groups).index_add_(0, group_index, rewards) / counts
    centred = rewards - means[group_index]
    if norm_by_std:
        sq = torch.zeros(num_groups).index_add_(0, group_index, centred**2)
        std = (sq / (counts - 1).clamp(min=1)).sqrt()
        centred = centred / (std[group_index] + eps)
    return centred[:, None] * response_mask


def rloo_advantages(rewards: Tensor, group_index: Tensor, response_mask: Tensor) -> Tensor:
    """Leave-one-out baseline: each reward minus the mean of the other rewards of its group."""
    num_groups = int(group_index.max()) + 1
    rewards = rewards.float()
    counts = torch.zeros(num_groups).index_add_(0, group_index, torch.ones_like(rewards))
    sums = torch.zeros(num_groups).index_add_(0, group_index, rewards)
    others = (counts[group_index] - 1).clamp(min=1)
    baseline = (sums[group_index] - rewards) / others
    advantages = torch.where(counts[group_index] > 1, rewards - baseline, torch.zeros_like(rewards))
    return advantages[:, None] * response_mask


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    token_mask: Tensor,
    response_mask: Tensor,
    *,
    gamma: float,
    lam: float,
    moments: Moments = local_moments,
) -> tuple[Tensor, Tensor]:
    """(whitened advantages, returns), both `[B, R]`."""
    values = values * token_mask
    advantages = torch.zeros_like(token_rewards)
    last_gae = torch.zeros(token_rewards.shape[0])
    length = token_rewards.shape[1]
    for t in reversed(range(length)):
        next_values = values[:, t + 1] if t + 1 < length else torch.zeros_like(last_gae)
        delta = token_rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = (delta + gamma * lam * last_gae) * token_mask[:, t]
        advantages[:, t] = last_gae
    returns = advantages + values
    return masked_whiten(advantages, response_mask, moments) * response_mask, returns


def reinforce_pp_advantages(
    token_rewards: Tensor, response_mask: Tensor, *, gamma: float, moments: Moments = local_moments
) -> tuple[Tensor, Tensor]:
    """(whitened advantages, discounted returns), both `[B, R]`."""
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
    return masked_whiten(returns, response_mask, moments) * response_mask, returns
