"""psrl: asynchronous RL post-training for LLMs, built as actors on a ZeroMQ message bus."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psrl.api import RunResult

try:
    __version__ = version("psrl")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"

__all__ = ["__version__", "run"]


def run(*args: Any, **kwargs: Any) -> RunResult:
    """Start a run and wait for it to end: `psrl.run("demo", ["trainer.total_steps=10"])` (see psrl.api.run)."""
    from psrl.api import run as run_config

    return run_config(*args, **kwargs)
