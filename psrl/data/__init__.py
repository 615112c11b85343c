"""Prompt datasets: files on disk (jsonl, parquet, datasets directories) as train and val splits."""

from __future__ import annotations

from typing import Any

from psrl.config import Config
from psrl.data.files import DataError, read_table
from psrl.data.prompts import PromptDataset, RenderSettings, load_split, render_prompt
from psrl.tasks.base import Task


def make_task(config: Config, tokenizer: Any) -> Task:
    """Where a run's training prompts come from: data.train_files when set, else the task named by task.name."""
    if config.agent.enabled:  # an agent's rows, rendered with the session gateway's chat template
        from psrl.gateway.agent_task import AgentTask

        return AgentTask.from_config(config)
    train = load_split(config.data, "train", tokenizer, config.task.max_prompt_length)
    if train is not None:
        return train
    from psrl.tasks import get_task
    from psrl.tasks.reasoning_gym import ReasoningGymTask, is_reasoning_gym

    if is_reasoning_gym(config.task.name):  # rendered with the model's chat template, so built with the tokenizer
        return ReasoningGymTask.from_config(config, tokenizer)
    return get_task(config.task.name, config.task.seed)


__all__ = ["DataError", "PromptDataset", "RenderSettings", "load_split", "make_task", "read_table", "render_prompt"]
