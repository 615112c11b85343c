"""Group filtering (the DAPO dynamic sampling filter): drop prompt groups without a learning signal.

A group whose metric (`score` = reward, or `acc`) is identical for every child gives every child
the same GRPO advantage of zero, so it only costs compute. The owner aborts such a group in the
ledger (reason FILTERED) before it occupies a slot, and dispatches one fresh prompt in its place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from psrl.rl.trajectory import Trajectory

FilterMetric = Literal["score", "acc"]


def metric_value(trajectory: Trajectory, metric: FilterMetric) -> float:
    if metric == "score":
        return trajectory.reward
    if trajectory.acc is None:
        raise ValueError(f"trajectory {trajectory.prompt_id}/{trajectory.child} has no acc for the acc filter")
    return trajectory.acc


def has_learning_signal(group: Sequence[Trajectory], metric: FilterMetric) -> bool:
    """False when every child of the group has the same metric value (zero variance)."""
    values = [metric_value(t, metric) for t in group]
    return max(values) != min(values)


def filter_groups(trajectories: Sequence[Trajectory], metric: FilterMetric) -> tuple[list[Trajectory], list[int]]:
    """Split trajectories into (kept, dropped prompt ids), keeping the input order of kept ones."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.prompt_id, []).append(t)
    dropped = [p for p, group in groups.items() if not has_learning_signal(group, metric)]
    dropped_set = set(dropped)
    return [t for t in trajectories if t.prompt_id not in dropped_set], dropped
