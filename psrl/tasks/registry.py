"""Single-turn task lookup by name (environments too: `psrl.envs.catalog.task_by_name`)."""

from __future__ import annotations

from collections.abc import Callable

from psrl.errors import ConfigError, ConfigProblem
from psrl.tasks.base import Task

TaskFactory = Callable[[int], Task]
_FACTORIES: dict[str, TaskFactory] = {}


def register_task(name: str, factory: TaskFactory) -> None:
    """Make `factory(seed)` available as `get_task(name, seed)`."""
    if name in _FACTORIES:
        raise ValueError(f"task {name!r} is already registered")
    _FACTORIES[name] = factory


def get_task(name: str, seed: int = 0) -> Task:
    factory = _FACTORIES.get(name)
    if factory is None:
        problem = ConfigProblem(("task.name",), repr(name), "unknown task", f"use one of {sorted(_FACTORIES)}")
        raise ConfigError([problem])
    return factory(seed)


def task_names() -> list[str]:
    return sorted(_FACTORIES)
