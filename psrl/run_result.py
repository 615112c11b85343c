"""How a run started by `psrl.run` ended, and its metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def steps(self) -> list[dict[str, Any]]:
        """The training metrics of each trained step, as the console's step lines show them: the
        coordinator's values (reward/mean, acc/mean, staleness/mean, throughput/..., reward/num_errors...)
        with the step number under "step". Other records (the trainer's, weight syncs, evaluations) are
        left out, and so are buffers handed over ahead that no step trained before the run ended."""
        records = self.metrics()
        trained = {r["step"] for r in records if str(r.get("sender", "")).startswith("trainer")}
        return [
            {"step": record["step"], **record["values"]}
            for record in records
            if record.get("sender") == "coordinator"
            and "reward/mean" in record.get("values", {})
            and (not trained or record["step"] in trained)
        ]
