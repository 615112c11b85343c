"""The trainer core: PPO-style updates of a Hugging Face policy on consumed staleness buffers.

`TrainerCore` is the in-process class the trainer actor wraps (one per data-parallel rank).
"""

from psrl.trainer.checkpoint import CheckpointError, latest_checkpoint
from psrl.trainer.core import TrainerCore, TrainStepResult, group_trajectories, resolve_model_dir
from psrl.trainer.parallel import ParallelContext
from psrl.trainer.stages import TrainerError

__all__ = [
    "CheckpointError",
    "ParallelContext",
    "TrainStepResult",
    "TrainerCore",
    "TrainerError",
    "group_trajectories",
    "latest_checkpoint",
    "resolve_model_dir",
]
