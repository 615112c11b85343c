"""Where a run's training prompts come from, over every source psrl knows.

A dataset file (``data.train_files``), an agent's rows rendered with the session gateway's chat
template (``agent.*``), a reasoning-gym dataset, or a task or environment named by ``task.name``.
The sources live in their own packages (data, gateway, tasks, envs); this choice sits above them.
"""

from __future__ import annotations

from typing import Any

from psrl.config import Config
from psrl.data import load_split
from psrl.envs.catalog import task_by_name
from psrl.tasks.base import Task
from psrl.tasks.reasoning_gym import ReasoningGymTask, is_reasoning_gym


def make_task(config: Config, tokenizer: Any) -> Task:
    """The run's training prompts: data.train_files when set, else the task named by task.name."""
    if config.agent.enabled:
        from psrl.gateway.agent_task import AgentTask  # the gateway's template rendering: imported when used

        return AgentTask.from_config(config)
    train = load_split(config.data, "train", tokenizer, config.task.max_prompt_length)
    if train is not None:
        return train
    if is_reasoning_gym(config.task.name):  # rendered with the model's chat template, so built with the tokenizer
        return ReasoningGymTask.from_config(config, tokenizer)
    return task_by_name(config.task.name, config.task.seed)
