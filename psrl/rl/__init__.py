"""RL algorithms: trajectory and batch types, advantage estimators, losses, rollout correction, filters."""

from bus.messages import FinishReason
from psrl.rl.advantages import (
    Moments,
    gae_advantages,
    grpo_advantages,
    local_moments,
    masked_mean,
    masked_whiten,
    reinforce_pp_advantages,
    token_level_rewards,
)
from psrl.rl.batch import Batch, Sample, collate, group_indices, scatter_rows
from psrl.rl.correction import ImportanceWeights, token_is_weights
from psrl.rl.filters import filter_groups, has_learning_signal
from psrl.rl.losses import aggregate, entropy_from_logits, kl_penalty, policy_loss, value_loss
from psrl.rl.objective import Denominators, actor_loss, compute_advantages
from psrl.rl.trajectory import InvalidTrajectoryError, Trajectory

__all__ = [
    "Batch",
    "Denominators",
    "FinishReason",
    "ImportanceWeights",
    "InvalidTrajectoryError",
    "Moments",
    "Sample",
    "Trajectory",
    "actor_loss",
    "aggregate",
    "collate",
    "compute_advantages",
    "entropy_from_logits",
    "filter_groups",
    "gae_advantages",
    "group_indices",
    "grpo_advantages",
    "has_learning_signal",
    "kl_penalty",
    "local_moments",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "reinforce_pp_advantages",
    "scatter_rows",
    "token_is_weights",
    "token_level_rewards",
    "value_loss",
]
