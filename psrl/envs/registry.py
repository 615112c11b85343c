"""Environment tasks by name (the names also work as ``task.name``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from psrl.envs.base import EnvTask
from psrl.envs.digit_chain import DigitChainTask
from psrl.envs.tool_add import ToolAddTask

_ENVIRONMENTS: dict[str, Callable[[int], EnvTask]] = {
    "digit_chain": lambda seed: DigitChainTask(seed=seed),
    "tool_add": lambda seed: ToolAddTask(seed=seed),
}


def env_names() -> list[str]:
    return sorted(_ENVIRONMENTS)


def is_env_name(name: str) -> bool:
    """A built-in environment, or one of your own as ``package.module:factory`` (``factory(seed)``)."""
    return name in _ENVIRONMENTS or ":" in name


def get_env_task(name: str, seed: int = 0) -> EnvTask:
    factory = _ENVIRONMENTS.get(name)
    if factory is None and ":" in name:
        module_name, attribute = name.split(":", 1)
        factory = getattr(importlib.import_module(module_name), attribute)
    if factory is None:
        raise KeyError(f"no environment named {name!r} (known: {', '.join(env_names())}, or package.module:factory)")
    return factory(seed)
