"""Training metrics: what the buffer contained (rewards, lengths, staleness) and what the update did.

All names are flat `group/name` keys with float values, ready for `metrics.jsonl`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bus.messages import FinishReason
from psrl.rl.trajectory import Trajectory
from psrl.trainer.parallel import ParallelContext


def buffer_metrics(buffer_id: int, trajectories: Sequence[Trajectory], staleness: int) -> dict[str, float]:
    """Reward, accuracy, length and staleness statistics of one consumed buffer (every rank sees all of it)."""
    rewards = [t.reward for t in trajectories]
    lengths = [t.num_response_tokens for t in trajectories]
    accs = [t.acc for t in trajectories if t.acc is not None]
    reasons = Counter(t.finish_reason for t in trajectories)
    num = len(trajectories)
    metrics = {
        "reward/mean": sum(rewards) / num,
        "reward/max": max(rewards),
        "reward/min": min(rewards),
        "response_length/mean": sum(lengths) / num,
        "response_length/max": float(max(lengths)),
        "response_length/clip_frac": reasons[FinishReason.LENGTH] / num,
        "response_length/truncated_frac": reasons[FinishReason.TRUNCATED] / num,
        "buffer/num_trajectories": float(num),
        "buffer/num_groups": float(len({t.prompt_id for t in trajectories})),
    }
    if accs:
        metrics["acc/mean"] = sum(accs) / len(accs)
    metrics.update(staleness_metrics(buffer_id, trajectories, staleness))
    return metrics


def staleness_metrics(buffer_id: int, trajectories: Sequence[Trajectory], staleness: int) -> dict[str, float]:
    """Histogram of `buffer_id - V_traj` per trajectory, per-token staleness, and bound violations."""
    histogram = Counter(buffer_id - t.version for t in trajectories)
    violations = sum(n for s, n in histogram.items() if not 0 <= s <= staleness)
    token_versions = [t.token_versions for t in trajectories if len(t.token_versions)]
    metrics = {f"staleness/hist/{s}": float(n) for s, n in sorted(histogram.items())}
    metrics["staleness/mean"] = sum(s * n for s, n in histogram.items()) / len(trajectories)
    metrics["staleness/max"] = float(max(histogram))
    metrics["staleness/bound_violations"] = float(violations)
    if token_versions:
        token_staleness = buffer_id - np.concatenate(token_versions).astype(np.int64)
        metrics["staleness/token_mean"] = int(token_staleness.sum()) / len(token_staleness)
    return metrics


QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)


@dataclass
class MetricSums:
    """Per-rank sums, maxima and minima that become means after a cross-rank reduction.

    Sparse means (`add_sparse`) are left out when no rank added any weight to them, so a rank may
    add only the keys its data has, provided every rank declares the same possible keys. Pooled
    values (`add_pooled`) become quantiles: exact on one rank, the mean of the ranks' own quantiles
    under data parallelism (an approximation, without gathering every value).
    """

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    minima: dict[str, float] = field(default_factory=dict)
    sparse: set[str] = field(default_factory=set)
    pooled: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def add(self, name: str, value: float, weight: float = 1.0) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.counts[name] = self.counts.get(name, 0.0) + weight

    def add_share(self, name: str, value: float, share: float) -> None:
        """Add this rank's contribution to one value that is a sum over ranks; `share` = 1 / world_size."""
        self.sums[name] = self.sums.get(name, 0.0) + value
        self.counts[name] = self.counts.get(name, 0.0) + share

    def add_sparse(self, name: str, value: float, weight: float) -> None:
        self.add(name, value, weight)
        self.sparse.add(name)

    def add_pooled(self, name: str, values: torch.Tensor) -> None:
        self.pooled.setdefault(name, []).append(values.detach().flatten().double().cpu())

    def add_max(self, name: str, value: float) -> None:
        self.maxima[name] = max(self.maxima.get(name, value), value)

    def add_min(self, name: str, value: float) -> None:
        self.minima[name] = min(self.minima.get(name, value), value)

    def reduce(self, parallel: ParallelContext) -> dict[str, float]:
        sums = parallel.sum_floats(
            {
                **{f"s:{k}": v for k, v in self.sums.items()},
                **{f"c:{k}": v for k, v in self.counts.items()},
                **self._quantile_terms(),
            }
        )
        out = {k: sums[f"s:{k}"] / max(sums[f"c:{k}"], 1e-12) for k in self.sums}
        out = {k: v for k, v in out.items() if k not in self.sparse or sums[f"c:{k}"] > 0}
        out.update(_quantiles_from(sums, self.pooled))
        out.update(_reduce_extreme(self.maxima, parallel, is_max=True))
        out.update(_reduce_extreme(self.minima, parallel, is_max=False))
        return out

    def _quantile_terms(self) -> dict[str, float]:
        """Each pooled name's quantiles as (value, 1) on a rank that has values, (0, 0) on one that has none."""
        terms = {}
        for name, parts in self.pooled.items():
            values = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
            has = values.numel() > 0
            found = torch.quantile(values, torch.tensor(QUANTILES, dtype=torch.float64)).tolist() if has else []
            for i, q in enumerate(QUANTILES):
                terms[f"q:{name}_q{round(100 * q):02d}"] = found[i] if has else 0.0
            terms[f"n:{name}"] = 1.0 if has else 0.0
        return terms


def _quantiles_from(sums: dict[str, float], pooled: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    out = {}
    for name in pooled:
        ranks = sums[f"n:{name}"]
        if ranks > 0:
            for q in QUANTILES:
                key = f"{name}_q{round(100 * q):02d}"
                out[key] = sums[f"q:{key}"] / ranks
    return out


def _reduce_extreme(values: dict[str, float], parallel: ParallelContext, *, is_max: bool) -> dict[str, float]:
    if not parallel.is_distributed or not values:
        return dict(values)
    keys = sorted(values)
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=parallel.device)
    op = torch.distributed.ReduceOp.MAX if is_max else torch.distributed.ReduceOp.MIN
    torch.distributed.all_reduce(tensor, op=op)
    return dict(zip(keys, tensor.tolist(), strict=True))
