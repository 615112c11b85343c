"""Tasks: seeded prompt generators with verifiable rewards, looked up by name."""

from psrl.tasks.base import Prompt, Reward, Task
from psrl.tasks.demo import DemoTask
from psrl.tasks.registry import get_task, register_task, task_names

register_task("demo", lambda seed: DemoTask(seed=seed))

__all__ = ["DemoTask", "Prompt", "Reward", "Task", "get_task", "register_task", "task_names"]
