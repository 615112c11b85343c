"""The decode cost model behind throughput_optimal routing and hypothesis_test sync.

One engine step decodes one token for each of ``n`` running requests and takes::

    step_time(n, kv_tokens) = k1 * kv_tokens + max(k2, k3 * n) + k4      [seconds]

``k1 * kv_tokens`` is attention over the resident KV cache, ``max(k2, k3 * n)`` is the
weight-bound floor versus the compute-bound growth with batch size, and ``k4`` is fixed
overhead. The instance's decode throughput is ``n / step_time`` tokens per second. This is the
seeds' formula with the KV term in tokens (utilisation x capacity), so one fit serves
instances with different KV capacities.

Re-computing a context of ``t`` tokens (a prefill, e.g. after a sync interrupted a request)
takes ``prefill_time(t)``: ``kp * t + ka * A + k4`` when the profile measured prefill steps
(``kp`` and ``ka`` fitted), otherwise the decode model read as one step over ``t`` tokens,
``max(k2, k3 * t) + k4``: prefill does per-token work like decode but in one pass. ``A`` counts
the attention's work: the sum, over the prefilled tokens, of the tokens each attends to (its
position plus one), ``t (t + 1) / 2`` for a fresh context. It matters where a turn prefills a few
thousand new tokens after a long cached prefix: for a Qwen2.5-1.5B shape, attending to 15k tokens
is as many flops per token as all its matrix products (and took several times as long on an H100,
docs/benchmarks.md), which a per-token ``kp`` cannot say.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "psrl.cost_model/1"
_COEFFICIENTS = ("k1", "k2", "k3", "k4")
_PREFILL = ("kp", "ka")


def fresh_attention(num_tokens: float) -> float:
    """The attention's work of prefilling a context of ``num_tokens`` tokens from its start."""
    return num_tokens * (num_tokens + 1) / 2


def prefill_attention(num_new: float, num_before: float) -> float:
    """The attention's work of prefilling ``num_new`` tokens after ``num_before`` already in the KV cache."""
    return num_new * (num_before + (num_new + 1) / 2)


class CostModelError(ValueError):
    """The cost-model file is missing, unreadable or malformed."""


@dataclass(frozen=True)
class CostModel:
    k1: float
    k2: float
    k3: float
    k4: float
    kp: float = 0.0  # seconds per prefill token; 0 = not profiled
    ka: float = 0.0  # seconds per (prefilled token x token it attends to); 0 = not profiled
    meta: dict[str, Any] = field(default_factory=dict)

    def scaled(self, factor: float) -> CostModel:
        """The same model with every step and prefill taking ``factor`` times as long."""
        if factor == 1.0:
            return self
        k1, k2, k3, k4, kp, ka = (value * factor for value in (self.k1, self.k2, self.k3, self.k4, self.kp, self.ka))
        return CostModel(k1, k2, k3, k4, kp, ka, dict(self.meta))

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

    def marginal_gains(self, loads: Sequence[tuple[int, float]], request_tokens: float) -> list[float]:
        """``marginal_gain`` for many (num_running, kv_tokens) loads at once (the routing hot path)."""
        k1, k2, k3, k4 = self.k1, self.k2, self.k3, self.k4
        gains = []
        for n, kv in loads:
            before = n / (k1 * kv + max(k2, k3 * n) + k4) if n > 0 else 0.0
            after = (n + 1) / (k1 * (kv + request_tokens) + max(k2, k3 * (n + 1)) + k4)
            gains.append(after - before)
        return gains

    def prefill_time(self, num_tokens: float, attended: float | None = None) -> float:
        """Seconds to (re)compute the KV of ``num_tokens`` tokens in one pass; ``attended``: the attention's
        work (see the module's docstring), by default that of a fresh context of ``num_tokens`` tokens."""
        if num_tokens <= 0:
            return 0.0
        if self.kp > 0:
            pairs = fresh_attention(num_tokens) if attended is None else attended
            return self.kp * num_tokens + self.ka * pairs + self.k4
        return max(self.k2, self.k3 * num_tokens) + self.k4

    def to_json(self) -> str:
        prefill = {"kp": self.kp, "ka": self.ka}
        data = {"schema": SCHEMA, **{k: getattr(self, k) for k in _COEFFICIENTS}, **prefill, "meta": self.meta}
        return json.dumps(data, indent=2, sort_keys=True)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> CostModel:
        """Parse and check a cost-model document; raises CostModelError naming what is wrong."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CostModelError(f"cost model {source} is not readable JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise CostModelError(f"cost model {source} is not a '{SCHEMA}' document")
        values = {key: _coefficient(data, key, source) for key in (*_COEFFICIENTS, *_PREFILL)}
        if values["k2"] + values["k4"] <= 0:
            raise CostModelError(f"cost model {source}: k2 + k4 must be > 0 (a step cannot take no time)")
        meta = data.get("meta", {})
        return cls(**values, meta=meta if isinstance(meta, dict) else {})

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return load_cost_model(path)


def _coefficient(data: dict[str, Any], key: str, source: str) -> float:
    value = data.get(key, 0.0 if key in _PREFILL else None)  # files written before prefill was profiled
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CostModelError(f"cost model {source}: coefficient {key} must be a finite number >= 0")
    return float(value)


def load_cost_model(path: str | Path) -> CostModel:
    """Read and check a cost-model JSON file; raises CostModelError naming what is wrong."""
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except FileNotFoundError as exc:
        raise CostModelError(f"cost model file {p} does not exist") from exc
    except OSError as exc:
        raise CostModelError(f"cost model file {p} is not readable: {exc}") from exc
    return CostModel.from_json(text, f"file {p}")
