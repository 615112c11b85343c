"""The run directory: everything a run leaves behind, in one place (ARCHITECTURE §7).

runs/<name>/
  config.yaml      fully resolved configuration (a run can be resumed from it)
  bus.json         the run's bus endpoints (read by `psrl tap`)
  run.json         launcher state: start/end time, exit status
  events/          the event log (segments)
  metrics.jsonl    one JSON object per training step (also TensorBoard files in tb/)
  checkpoints/     trainer checkpoints
  report/          plots and report.html
  logs/            per-actor output (<actor>.log) and structured logs (<actor>.jsonl)
  keys/            CURVE key pairs when the bus is encrypted
  status/          per-instance status snapshots (stats recorder)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUBDIRS = ("events", "checkpoints", "report", "logs", "keys", "status", "tb")


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def create(cls, root: str | Path, name: str | None = None) -> RunDir:
        """Create (or reopen, for resume) ``root/name``; a missing name gets a timestamp."""
        name = name or time.strftime("%Y%m%d-%H%M%S")
        run = cls(Path(root).resolve() / name)
        for sub in SUBDIRS:
            (run.path / sub).mkdir(parents=True, exist_ok=True)
        run.keys.chmod(0o700)  # the bus's secret keys: the owner's alone
        return run

    def write_config(self, text: str) -> None:
        """Write the resolved config, readable by the owner only (it may name endpoints and credentials)."""
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        self.config.chmod(0o600)  # an older file keeps its mode through O_TRUNC

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def bus(self) -> Path:
        return self.path / "bus.json"

    @property
    def state(self) -> Path:
        return self.path / "run.json"

    @property
    def events(self) -> Path:
        return self.path / "events"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def report(self) -> Path:
        return self.path / "report"

    @property
    def keys(self) -> Path:
        return self.path / "keys"

    @property
    def status(self) -> Path:
        return self.path / "status"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tb"

    def log_file(self, actor: str, structured: bool = False) -> Path:
        return self.path / "logs" / f"{actor}.{'jsonl' if structured else 'log'}"

    def write_state(self, **fields: Any) -> None:
        """Merge ``fields`` into run.json (written atomically)."""
        current = self.read_state()
        current.update(fields)
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state)

    def read_state(self) -> dict[str, Any]:
        if not self.state.exists():
            return {}
        data = json.loads(self.state.read_text())
        return data if isinstance(data, dict) else {}


def resolve_run_dir(run: str | Path, root: str | Path = "runs") -> RunDir:
    """Find an existing run by path or by name under ``root``."""
    for candidate in (Path(run), Path(root) / str(run)):
        if (candidate / "events").is_dir() or (candidate / "config.yaml").is_file():
            return RunDir(candidate.resolve())
    raise FileNotFoundError(f"no run directory at {run} (or {Path(root) / str(run)})")
