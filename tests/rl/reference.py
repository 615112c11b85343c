"""Independent references for the correction and loss formulas: plain numpy, one row and one token at a time.

Written from the papers' definitions, not from psrl's code, so a shared mistake would have to be
made twice. Gradients are with respect to the current log-probs and worked out by hand.
"""

from __future__ import annotations

import math

import numpy as np


def level_ratios(log_ratio: np.ndarray, mask: np.ndarray, level: str) -> np.ndarray:
    """Per position: the token ratio, or the row's product / geometric mean of its trained tokens' ratios."""
    out = np.ones_like(log_ratio)
    for i in range(log_ratio.shape[0]):
        trained = [log_ratio[i, t] for t in range(log_ratio.shape[1]) if mask[i, t] > 0]
        for t in range(log_ratio.shape[1]):
            if level == "token":
                out[i, t] = math.exp(log_ratio[i, t]) if mask[i, t] > 0 else 1.0
            elif level == "sequence":
                out[i, t] = math.prod(math.exp(x) for x in trained)
            else:
                out[i, t] = math.exp(sum(trained) / len(trained)) if trained else 1.0
    return out


def is_weights(log_ratio: np.ndarray, mask: np.ndarray, level: str, lower: float | None, upper: float) -> np.ndarray:
    ratios = level_ratios(log_ratio, mask, level)
    low = 0.0 if lower is None else lower
    return np.where(mask > 0, np.minimum(np.maximum(ratios, low), upper), 0.0)


def accept(log_ratio: np.ndarray, mask: np.ndarray, level: str, lower: float, upper: float) -> np.ndarray:
    ratios = level_ratios(log_ratio, mask, level)
    inside = (ratios >= lower) & (ratios <= upper)
    return np.where((mask > 0) & inside, 1.0, 0.0)


def vetoed(log_ratio: np.ndarray, mask: np.ndarray, threshold: float) -> np.ndarray:
    rows = log_ratio.shape[0]
    return np.array([any(mask[i, t] > 0 and math.exp(log_ratio[i, t]) < threshold
                         for t in range(log_ratio.shape[1])) for i in range(rows)])  # fmt: skip


def ppo(
    lp: np.ndarray, old: np.ndarray, adv: np.ndarray, low: float, high: float, c: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """(token losses, d loss / d lp) of the clipped surrogate, dual-clipped when `c` is set."""
    loss = np.zeros_like(lp)
    grad = np.zeros_like(lp)
    for idx in np.ndindex(lp.shape):
        r = math.exp(lp[idx] - old[idx])
        a = adv[idx]
        unclipped, clipped = -a * r, -a * min(max(r, 1 - low), 1 + high)
        inside = 1 - low <= r <= 1 + high
        value, slope = (unclipped, -a * r) if unclipped >= clipped else (clipped, -a * r if inside else 0.0)
        if c is not None and a < 0 and value > -a * c:
            value, slope = -a * c, 0.0
        loss[idx], grad[idx] = value, slope
    return loss, grad


def cispo(lp: np.ndarray, old: np.ndarray, adv: np.ndarray, low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """(token losses, d loss / d lp) of -sg(clip(r)) A log pi."""
    weight = np.clip(np.exp(lp - old), 1 - low, 1 + high)
    return -weight * adv * lp, -weight * adv


def gspo_objective(lp: np.ndarray, old: np.ndarray, adv: np.ndarray, mask: np.ndarray, low: float, high: float
                   ) -> tuple[float, np.ndarray]:  # fmt: skip
    """(loss, d loss / d lp) of GSPO: mean over sequences of max(-A s, -A clip(s)), s = exp(mean_t log r_t)."""
    rows = lp.shape[0]
    total = 0.0
    grad = np.zeros_like(lp)
    for i in range(rows):
        n = mask[i].sum()
        if n == 0:
            continue
        s = math.exp(float(((lp[i] - old[i]) * mask[i]).sum()) / n)
        a = adv[i, int(np.argmax(mask[i] > 0))]
        unclipped, clipped = -a * s, -a * min(max(s, 1 - low), 1 + high)
        total += max(unclipped, clipped)
        if unclipped >= clipped:  # ds / d lp_t = s / n on trained tokens
            grad[i] = -a * s / n * mask[i]
    return total / rows, grad / rows


def rloo(rewards: list[float], groups: list[int]) -> list[float]:
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        others = [rewards[j] for j in range(len(rewards)) if groups[j] == g and j != i]
        out.append(r - sum(others) / len(others) if others else 0.0)
    return out


def overlong(length: int, max_length: int, buffer_len: int, factor: float) -> float:
    """DAPO's reward shaping, as its reference implementation writes it."""
    expected = max_length - buffer_len
    exceed = length - expected
    return min(-exceed / buffer_len * factor, 0.0)
