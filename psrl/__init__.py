"""psrl: asynchronous RL post-training for LLMs, built as actors on a ZeroMQ message bus."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from psrl.run_result import RunResult

try:
    __version__ = version("psrl")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"

__all__ = ["RunResult", "__version__", "run", "scale"]


def run(*args: Any, **kwargs: Any) -> RunResult:
    """Start a run and wait for it to end: `psrl.run("demo", ["trainer.total_steps=10"])` (see launch.api.run)."""
    # the package's own module is the front door, above the launcher (the import contract's top layer);
    # imported here so `import psrl` stays light for every actor process
    from launch.api import run as run_launched

    return run_launched(*args, **kwargs)


def scale(*args: Any, **kwargs: Any) -> Any:
    """Add or remove rollout instances of a running run: `psrl.scale("runs/x", "rollout=+2")` (psrl.scale_request)."""
    from psrl.scale_request import scale as ask

    return ask(*args, **kwargs)
