"""Rewards: user reward functions (`reward.function`), built-in verifiers, and the coordinator's scorer."""

from psrl.rewards.loader import ARGUMENTS, RewardFunction, RewardLoadError, load_reward_function
from psrl.rewards.scorer import FunctionScorer, Scorer, TaskScorer, to_reward

__all__ = [
    "ARGUMENTS",
    "FunctionScorer",
    "RewardFunction",
    "RewardLoadError",
    "Scorer",
    "TaskScorer",
    "load_reward_function",
    "to_reward",
]
