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
    import importlib

    # the launcher sits above the library (the import contract), so the library names it, as the CLI does
    api = importlib.import_module("launch.api")
    result: RunResult = api.run(*args, **kwargs)
    return result


def scale(*args: Any, **kwargs: Any) -> Any:
    """Add or remove rollout instances of a running run: `psrl.scale("runs/x", "rollout=+2")` (psrl.scale_request)."""
    from psrl.scale_request import scale as ask

    return ask(*args, **kwargs)
