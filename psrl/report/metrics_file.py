"""``<run>/metrics.jsonl``: one JSON object per `obs.metrics` event.

    {"step": 3, "sender": "coordinator", "incarnation": 0, "wall_time": 1795943121.45,
     "model_version": 3, "values": {"reward/mean": 0.31, ...}, "notes": {"reward/first_error": "..."}}

``wall_time`` is the sender's wall clock in seconds since the epoch. Non-finite values are written
as null (strict JSON has no NaN) and read back as NaN. ``notes`` (text that goes with the values,
such as a step's first failed reward call) is written only when there are some.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bus.messages import Metrics
from bus.schema import Event


@dataclass(frozen=True)
class MetricsRecord:
    step: int
    sender: str
    incarnation: int
    wall_time: float
    model_version: int | None
    values: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_event(cls, event: Event[Metrics]) -> MetricsRecord:
        envelope = event.envelope
        return cls(
            step=event.message.step,
            sender=envelope.sender,
            incarnation=envelope.incarnation,
            wall_time=envelope.wall_ns / 1e9,
            model_version=envelope.model_version,
            values=dict(event.message.values),
            notes=dict(event.message.notes),
        )

    def to_json_line(self) -> str:
        values = {name: (value if math.isfinite(value) else None) for name, value in self.values.items()}
        body = {
            "step": self.step,
            "sender": self.sender,
            "incarnation": self.incarnation,
            "wall_time": self.wall_time,
            "model_version": self.model_version,
            "values": values,
        }
        if self.notes:
            body["notes"] = self.notes
        return json.dumps(body, allow_nan=False, separators=(",", ":")) + "\n"

    @classmethod
    def from_json(cls, body: Any) -> MetricsRecord:
        """Parse one decoded line; raises ValueError (naming the field) when it is not a metrics record."""
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        values = body.get("values")
        if not isinstance(values, dict):
            raise ValueError("'values' is not an object")
        version = body.get("model_version")
        return cls(
            step=_int(body, "step"),
            sender=str(body.get("sender", "")),
            incarnation=_int(body, "incarnation"),
            wall_time=float(body.get("wall_time", 0.0)),
            model_version=None if version is None else int(version),
            values={str(name): math.nan if value is None else float(value) for name, value in values.items()},
            notes={str(k): str(v) for k, v in notes.items()} if isinstance(notes := body.get("notes"), dict) else {},
        )


def _int(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"'{name}' is not an integer: {value!r}")
    return value


def read_metrics_file(path: str | Path) -> tuple[list[MetricsRecord], list[str]]:
    """Every readable record, and one problem line per line that is not one (nothing is dropped silently)."""
    records: list[MetricsRecord] = []
    problems: list[str] = []
    with Path(path).open(encoding="utf-8") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                records.append(MetricsRecord.from_json(json.loads(line)))
            except (ValueError, TypeError) as error:
                problems.append(f"{path}:{number}: {error}")
    return records, problems
