"""The coordinator's scorer for a config: reward.function when set, else the task's own reward."""

from __future__ import annotations

from psrl.config import Config
from psrl.rewards.loader import load_reward_function
from psrl.rewards.scorer import FunctionScorer, Scorer, TaskScorer
from psrl.tasks.base import Task


def make_scorer(config: Config, task: Task) -> Scorer:
    if config.reward.function is None:
        return TaskScorer(task, config.reward.error_score)
    table = getattr(task, "table", None)
    columns = list(getattr(table, "column_names", []))
    function = load_reward_function(config.reward.function, columns, config.reward.kwargs)
    return FunctionScorer(function, config.reward)
