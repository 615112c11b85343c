"""The Python API: start a run from a script or a notebook, exactly as `psrl launch` would.

    import psrl

    result = psrl.run("examples/digits/config.yaml", ["trainer.total_steps=10"])
    print(result.ok, result.run_dir)
    for record in result.metrics():          # metrics.jsonl, one dict per Metrics event
        print(record["step"], record["values"].get("reward/mean"))

`config` is a preset name, a YAML path or a `psrl.config.Config` (e.g. from
`psrl.config.load_config`); `overrides` are `key=value` strings as on the command line. The same
checks as `psrl launch` run first (a `ConfigError` lists every problem), then the actors start on
this machine and the call returns when the run ends. Call it from the main thread: Ctrl-C (or
SIGTERM) stops the run after the trainer has saved a checkpoint. An existing `name` under `root`
is resumed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psrl.config import Config, load_config


@dataclass(frozen=True)
class RunResult:
    exit_code: int  # 0 finished, 1 failed, 130 interrupted
    reason: str | None
    run_dir: Path

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def metrics(self) -> list[dict[str, Any]]:
        """Every metrics record of the run (metrics.jsonl), in the order they were written."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(
    config: Config | str = "demo",
    overrides: Sequence[str] = (),
    *,
    name: str | None = None,
    root: str | Path | None = None,
    quiet: bool = True,
) -> RunResult:
    """Check the configuration, run it on this machine and return how it ended."""
    from psrl.launch.preflight import checked
    from psrl.launch.runner import run_launch

    if isinstance(config, Config):
        resolved = load_config(None, overrides, base=config)
    else:
        resolved = load_config(config, overrides)
    resolved = checked(resolved)
    result = run_launch(resolved, None, name=name, root=None if root is None else str(root), quiet=quiet)
    return RunResult(result.exit_code, result.reason, result.run_dir)
