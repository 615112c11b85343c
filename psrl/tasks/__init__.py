"""Tasks: seeded prompt generators with verifiable rewards, looked up by name."""

from psrl.tasks.base import Prompt, Reward, Task
from psrl.tasks.demo import DemoTask
from psrl.tasks.registry import get_task, register_task, task_names

register_task("demo", lambda seed: DemoTask(seed=seed))
# Short strings only (1-6 digits, uniform): where the demo model is partly right, so reinforcement
# learning has a signal to sharpen within minutes (the launch demo's task).
register_task(
    "demo_short",
    lambda seed: DemoTask(seed=seed, max_length=6, length_skew=1.0, name="demo_short", exact_reward=True),
)


__all__ = ["DemoTask", "Prompt", "Reward", "Task", "get_task", "register_task", "task_names"]
