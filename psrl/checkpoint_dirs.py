"""Where a run's checkpoints and shard snapshots lie, read without torch: the launcher needs these before
it starts anything (the version a resumed run continues from, the snapshots a finished run drops), and
importing the trainer or the parameter server for them would put torch on its start-up path."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from psrl.errors import PsrlError

STEP_PREFIX = "step_"
HEADER_SUFFIX = ".committed"  # a shard snapshot's header (``psrl.ps.snapshot``)
DATA_SUFFIX = ".data"  # a shard snapshot's tensor bytes


class CheckpointError(PsrlError):
    """A checkpoint is missing, incomplete or does not match the model."""


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest version under `root`, if any."""
    root = Path(root)
    if not root.is_dir():
        return None
    return max(complete_dirs(root), key=version_of, default=None)


def complete_dirs(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX) and p.suffix != ".tmp"]


def version_of(path: Path) -> int:
    return int(path.name.removeprefix(STEP_PREFIX))


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.json (version, next_prompt_id, ...)."""
    return read_json(Path(path) / "trainer_state.json")


def read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"{path} is missing: not a complete checkpoint")
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def remove_snapshots(directory: Path) -> int:
    """Delete every shard's snapshot files in ``directory`` (a run that finished needs none); how many."""
    removed = 0
    for pattern in (f"ps-*{HEADER_SUFFIX}", f"ps-*{DATA_SUFFIX}", "ps-*.tmp"):
        for path in directory.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed
