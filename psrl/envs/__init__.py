"""Multi-turn environments: tasks whose episodes alternate model turns with environment steps.

An environment task is a task (``psrl.tasks``: seeded prompts, a single-turn reward) that also
makes one ``Environment`` per prompt: ``reset()`` gives the first observation (the prompt text),
``step(action)`` answers one model turn with the next observation, the reward so far and whether
the episode is over. Environments run in env worker processes (``psrl.envs.host``) owned by the
session scheduler; they are looked up by ``task.name``.
"""

from psrl.envs.base import EnvError, Environment, EnvTask, StepResult
from psrl.envs.registry import env_names, get_env_task, is_env_name

__all__ = ["EnvError", "EnvTask", "Environment", "StepResult", "env_names", "get_env_task", "is_env_name"]
