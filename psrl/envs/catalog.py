"""Every task a run can name in ``task.name``: the registered single-turn tasks and the environments.

Environments build on tasks (an environment task is a task whose first answer can be scored alone),
so the one lookup over both lives here, above the two registries.
"""

from __future__ import annotations

from psrl.envs.registry import env_names, get_env_task, is_env_name
from psrl.errors import ConfigError, ConfigProblem
from psrl.tasks.base import Task
from psrl.tasks.registry import get_task, task_names


def all_task_names() -> list[str]:
    return sorted(task_names() + env_names())


def is_task_name(name: str) -> bool:
    """A registered task, a built-in environment, or an environment of your own (module:factory)."""
    return name in task_names() or is_env_name(name)


def task_by_name(name: str, seed: int = 0) -> Task:
    """The task ``task.name`` names; multi-turn environments are tasks too (single-turn runs score
    their first answer)."""
    if name in task_names():
        return get_task(name, seed)
    if is_env_name(name):
        return get_env_task(name, seed)
    problem = ConfigProblem(("task.name",), repr(name), "unknown task",
                            f"use one of {all_task_names()}, or an environment as package.module:factory")  # fmt: skip
    raise ConfigError([problem])
