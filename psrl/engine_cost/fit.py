"""Least-squares fit of the decode cost model from profiled engine steps.

Each sample is one measured engine step: ``num_running`` decoding requests over ``kv_tokens``
resident tokens took ``step_time_s`` seconds (plus ``num_prefill_tokens`` tokens prefilled in
the same step, if any). The model ``k1 * kv + max(k2, k3 * n) + k4`` has a kink where the
weight-bound floor ``k2`` meets the compute growth ``k3 * n``, at ``n* = k2 / k3``. For a fixed
``n*`` the model is linear in ``(k1, k3, k4)`` with feature ``max(n*, n)`` (and ``k2 = k3 n*``),
so the fit searches ``n*``: every observed batch size and the midpoints between them, then a
golden-section refinement around the best, each candidate solved by non-negative least squares.
Samples with prefill tokens then fit ``kp`` and ``ka`` (per prefilled token, per unit of the
attention's work ``attended``) on the residual of the decode model, by non-negative least squares;
``ka`` is 0 where the samples cannot tell it apart (all prefills of one shape) or do not record
``attended``.

The fit does not need an engine: ``psrl calibrate`` profiles one and passes its samples here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from psrl.engine_cost.model import CostModel, CostModelError

_GOLDEN = (math.sqrt(5) - 1) / 2
_MIN_SAMPLES = 4


class ProfileSample(msgspec.Struct, frozen=True, gc=False, array_like=True):
    num_running: int
    kv_tokens: float
    step_time_s: float
    num_prefill_tokens: int = 0
    attended: float = 0.0  # the prefill's attention work (psrl.engine_cost.model.prefill_attention)


@dataclass(frozen=True)
class FitReport:
    model: CostModel
    num_samples: int
    rmse_s: float
    mean_abs_pct_error: float  # mean of |predicted - measured| / measured
    r2: float
    breakpoint: float  # n* = k2 / k3: below it a step costs the same whatever the batch size
    is_kink_observed: bool  # samples lie on both sides of the breakpoint (otherwise it is extrapolated)

    def summary(self) -> str:
        m = self.model
        return (
            f"k1={m.k1:.4g} k2={m.k2:.4g} k3={m.k3:.4g} k4={m.k4:.4g} kp={m.kp:.4g} ka={m.ka:.4g}  "
            f"samples={self.num_samples} rmse={self.rmse_s * 1e3:.3f} ms mape={self.mean_abs_pct_error * 100:.2f}% "
            f"r2={self.r2:.4f} breakpoint n*={self.breakpoint:.1f}{'' if self.is_kink_observed else ' (extrapolated)'}"
        )


def save_samples(samples: Sequence[ProfileSample], path: str | Path) -> None:
    """Write profiled steps as JSON lines ``[num_running, kv_tokens, step_time_s, num_prefill_tokens, attended]``."""
    encoder = msgspec.json.Encoder()
    Path(path).write_bytes(b"".join(encoder.encode(s) + b"\n" for s in samples))


def load_samples(path: str | Path) -> list[ProfileSample]:
    """Read profiled steps written by ``save_samples``; raises CostModelError naming the bad line."""
    decoder = msgspec.json.Decoder(ProfileSample)
    samples = []
    for number, line in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            samples.append(decoder.decode(line))
        except msgspec.DecodeError as exc:
            raise CostModelError(f"{path}:{number}: not a profiled step ({exc})") from exc
    return samples


def fit_cost_model(samples: Sequence[ProfileSample], meta: dict[str, Any] | None = None) -> FitReport:
    """Fit k1..k4 (and kp, ka when prefill steps were profiled); raises CostModelError on unusable data."""
    decode = [s for s in samples if s.num_prefill_tokens == 0]
    _check(decode)
    n = np.array([s.num_running for s in decode], dtype=float)
    kv = np.array([s.kv_tokens for s in decode], dtype=float)
    y = np.array([s.step_time_s for s in decode], dtype=float)
    breakpoint, (k1, k3, k4) = _search_breakpoint(n, kv, y)
    model = CostModel(k1, k3 * breakpoint, k3, k4, meta=dict(meta or {}))
    if model.k2 + model.k4 <= 0:
        raise CostModelError("the fit found steps that take no time; profile steps with real work")
    kp, ka = _fit_prefill(model, [s for s in samples if s.num_prefill_tokens > 0])
    model = CostModel(model.k1, model.k2, model.k3, model.k4, kp, ka, model.meta)
    predicted = np.array([model.step_time(int(a), b) for a, b in zip(n, kv, strict=True)])
    residual = predicted - y
    total = float(np.sum((y - y.mean()) ** 2))
    return FitReport(
        model=model,
        num_samples=len(decode),
        rmse_s=float(np.sqrt(np.mean(residual**2))),
        mean_abs_pct_error=float(np.mean(np.abs(residual) / y)),
        r2=1.0 - float(np.sum(residual**2)) / total if total > 0 else 1.0,
        breakpoint=breakpoint,
        is_kink_observed=bool(n.min() < breakpoint < n.max()),
    )


def _check(decode: Sequence[ProfileSample]) -> None:
    if len(decode) < _MIN_SAMPLES:
        raise CostModelError(f"need at least {_MIN_SAMPLES} decode-only samples to fit, got {len(decode)}")
    for s in decode:
        if s.num_running < 1 or s.kv_tokens < 0 or not (math.isfinite(s.step_time_s) and s.step_time_s > 0):
            raise CostModelError(f"unusable sample {s}: need num_running >= 1, kv_tokens >= 0, step_time_s > 0")
    if len({s.num_running for s in decode}) < 2:
        raise CostModelError("profile at least two batch sizes: one batch size cannot separate k3 from k4")


def _search_breakpoint(n: np.ndarray, kv: np.ndarray, y: np.ndarray) -> tuple[float, tuple[float, float, float]]:
    sizes = np.unique(n)
    # Every breakpoint at or below the smallest profiled batch fits the samples equally (each is then
    # k3 * n): the smallest batch is the one of them that does not claim an empty step is free.
    grid = sorted({*sizes.tolist(), *((sizes[:-1] + sizes[1:]) / 2).tolist()})
    scored = [(_sse(b, n, kv, y), b) for b in grid]
    _, best = min(scored)
    position = grid.index(best)
    low, high = grid[max(0, position - 1)], grid[min(len(grid) - 1, position + 1)]
    best = _golden_section(lambda b: _sse(b, n, kv, y), low, high, best)
    return best, _solve(best, n, kv, y)[0]


def _golden_section(cost: Any, low: float, high: float, start: float, iterations: int = 40) -> float:
    """Minimise a one-dimensional cost on [low, high]; never returns worse than ``start``."""
    best, best_cost = start, cost(start)
    a, b = low, high
    for _ in range(iterations):
        c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
        if cost(c) < cost(d):
            b = d
        else:
            a = c
        middle = (a + b) / 2
        if (middle_cost := cost(middle)) < best_cost:
            best, best_cost = middle, middle_cost
    return best


def _sse(breakpoint: float, n: np.ndarray, kv: np.ndarray, y: np.ndarray) -> float:
    return _solve(breakpoint, n, kv, y)[1]


def _solve(breakpoint: float, n: np.ndarray, kv: np.ndarray, y: np.ndarray) -> tuple[tuple[float, float, float], float]:
    """Non-negative least squares for (k1, k3, k4) at a fixed breakpoint, by active-set enumeration."""
    features = np.column_stack([kv, np.maximum(breakpoint, n), np.ones_like(n)])
    best: tuple[tuple[float, float, float], float] | None = None
    for size in (3, 2, 1):
        for active in itertools.combinations(range(3), size):
            coef, *_ = np.linalg.lstsq(features[:, active], y, rcond=None)
            if np.any(coef < 0):
                continue
            full = np.zeros(3)
            full[list(active)] = coef
            sse = float(np.sum((features @ full - y) ** 2))
            if best is None or sse < best[1]:
                best = ((float(full[0]), float(full[1]), float(full[2])), sse)
    if best is None:  # cannot happen with positive step times: the intercept alone is non-negative
        raise CostModelError("no non-negative fit exists for these samples")
    return best


def _fit_prefill(model: CostModel, prefill: Sequence[ProfileSample]) -> tuple[float, float]:
    """(kp, ka) from the residual of steps that prefilled: seconds per prefilled token and per unit of
    attention work, both >= 0; kp alone (ka 0) where the two cannot be told apart."""
    if not prefill:
        return 0.0, 0.0
    x = np.array([s.num_prefill_tokens for s in prefill], dtype=float)
    a = np.array([s.attended for s in prefill], dtype=float)
    # a step that only prefilled pays the fixed k4 (as prefill_time charges it); one that also decoded, its decode
    residual = np.array([s.step_time_s - (model.step_time(s.num_running, s.kv_tokens) if s.num_running else model.k4)
                         for s in prefill])  # fmt: skip
    per_token = max(0.0, float(np.dot(x, residual) / np.dot(x, x)))
    features = np.stack([x, a], axis=1)
    if np.linalg.matrix_rank(features) < 2:
        return per_token, 0.0
    kp, ka = np.linalg.lstsq(features, residual, rcond=None)[0]
    if kp < 0 or ka < 0:  # the non-negative optimum lies on an axis: ka = 0 (kp alone) or kp = 0
        ka_only = max(0.0, float(np.dot(a, residual) / np.dot(a, a)))
        alone = float(np.sum((residual - per_token * x) ** 2))
        return (per_token, 0.0) if alone <= float(np.sum((residual - ka_only * a) ** 2)) else (0.0, ka_only)
    return float(kp), float(ka)
