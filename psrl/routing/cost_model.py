"""The decode cost model behind throughput_optimal routing and hypothesis_test sync.

One engine step decodes one token for each of ``n`` running requests and takes::

    step_time(n, kv_tokens) = k1 * kv_tokens + max(k2, k3 * n) + k4      [seconds]

``k1 * kv_tokens`` is attention over the resident KV cache, ``max(k2, k3 * n)`` is the
weight-bound floor versus the compute-bound growth with batch size, and ``k4`` is fixed
overhead. The instance's decode throughput is ``n / step_time`` tokens per second. This is the
seeds' formula with the KV term in tokens (utilisation x capacity), so one fit serves
instances with different KV capacities.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "psrl.cost_model/1"
_COEFFICIENTS = ("k1", "k2", "k3", "k4")


class CostModelError(ValueError):
    """The cost-model file is missing, unreadable or malformed."""


@dataclass(frozen=True)
class CostModel:
    k1: float
    k2: float
    k3: float
    k4: float
    meta: dict[str, Any] = field(default_factory=dict)

    def step_time(self, num_running: int, kv_tokens: float) -> float:
        """Seconds per engine step with ``num_running`` decoding requests over ``kv_tokens``."""
        return self.k1 * kv_tokens + max(self.k2, self.k3 * num_running) + self.k4

    def throughput(self, num_running: int, kv_tokens: float) -> float:
        """Decode tokens per second of one instance."""
        if num_running <= 0:
            return 0.0
        return num_running / self.step_time(num_running, kv_tokens)

    def marginal_gain(self, num_running: int, kv_tokens: float, request_tokens: float) -> float:
        """Throughput added by placing one more request of ``request_tokens`` on the instance."""
        after = self.throughput(num_running + 1, kv_tokens + request_tokens)
        return after - self.throughput(num_running, kv_tokens)

    def to_json(self) -> str:
        data = {"schema": SCHEMA, **{k: getattr(self, k) for k in _COEFFICIENTS}, "meta": self.meta}
        return json.dumps(data, indent=2, sort_keys=True)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_cost_model(path: str | Path) -> CostModel:
    """Read and check a cost-model JSON file; raises CostModelError naming what is wrong."""
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise CostModelError(f"cost model file {p} does not exist") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise CostModelError(f"cost model file {p} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CostModelError(f"cost model file {p} is not a '{SCHEMA}' document")
    values: dict[str, float] = {}
    for key in _COEFFICIENTS:
        value = data.get(key)
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise CostModelError(f"cost model file {p}: coefficient {key} must be a finite number >= 0")
        values[key] = float(value)
    if values["k2"] + values["k4"] <= 0:
        raise CostModelError(f"cost model file {p}: k2 + k4 must be > 0 (a step cannot take no time)")
    meta = data.get("meta", {})
    return CostModel(**values, meta=meta if isinstance(meta, dict) else {})
