"""The asynchrony study's arithmetic: runs of several settings and seeds -> the table and the RESULT line.

A run is summarised by its held-out accuracy at each evaluated version, its training wall time
(first dispatch to the last step), and what its certificates say (mean staleness, clipped
importance weights). Settings are compared with the synchronous one at equal training steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SYNC = "sync"


@dataclass(frozen=True)
class StudyRun:
    setting: str
    seed: int
    curve: dict[int, float]  # version -> eval/acc
    pass_k: float  # at the last evaluated version
    wall_s: float  # first dispatch to the last training step
    mean_staleness: float
    clipped_frac: float  # mean over trajectories of the fraction of clipped weights (nan = no IS)
    mean_length: float  # mean trained response length

    @property
    def final_acc(self) -> float:
        return self.curve[max(self.curve)] if self.curve else float("nan")


@dataclass(frozen=True)
class SettingRow:
    setting: str
    num_seeds: int
    acc_mean: float
    acc_std: float
    pass_k: float
    gain: float  # final acc - acc at version 0, points
    wall_s: float
    speedup: float  # sync wall / this wall
    acc_gap: float  # sync acc - this acc, points
    mean_staleness: float
    clipped_frac: float
    mean_length: float
    seeds: list[float] = field(default_factory=list)


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def summarize(runs: Sequence[StudyRun], order: Sequence[str]) -> list[SettingRow]:
    by_setting = {name: [r for r in runs if r.setting == name] for name in order}
    sync = by_setting.get(SYNC) or []
    sync_acc = _mean([r.final_acc for r in sync])
    sync_wall = _mean([r.wall_s for r in sync])
    rows = []
    for name, group in by_setting.items():
        if not group:
            continue
        accs = [r.final_acc for r in group]
        wall = _mean([r.wall_s for r in group])
        start = _mean([r.curve.get(0, float("nan")) for r in group])
        rows.append(SettingRow(
            setting=name, num_seeds=len(group), acc_mean=_mean(accs), acc_std=float(np.std(accs)),
            pass_k=_mean([r.pass_k for r in group]), gain=100 * (_mean(accs) - start), wall_s=wall,
            speedup=sync_wall / wall if wall > 0 else float("nan"), acc_gap=100 * (sync_acc - _mean(accs)),
            mean_staleness=_mean([r.mean_staleness for r in group]),
            clipped_frac=_mean([r.clipped_frac for r in group]), mean_length=_mean([r.mean_length for r in group]),
            seeds=accs,
        ))  # fmt: skip
    return rows


def table(rows: Sequence[SettingRow], k: int) -> list[str]:
    head = (f"{'setting':<10} {'seeds':>5} {'eval acc':>15} {f'pass@{k}':>7} {'gain':>6} {'gap':>6} "
            f"{'wall s':>7} {'speedup':>7} {'stale':>5} {'clipped':>7} {'length':>6}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.setting:<10} {r.num_seeds:>5} {100 * r.acc_mean:>7.1f} ± {100 * r.acc_std:>4.1f} "
                     f"{100 * r.pass_k:>7.1f} {r.gain:>+6.1f} {r.acc_gap:>+6.1f} {r.wall_s:>7.0f} "
                     f"{r.speedup:>6.2f}x {r.mean_staleness:>5.2f} {_percent(r.clipped_frac):>7} "
                     f"{r.mean_length:>6.1f}")  # fmt: skip
    return lines


def _percent(value: float) -> str:
    return "-" if not np.isfinite(value) else f"{100 * value:.1f}%"


def result_line(rows: Sequence[SettingRow]) -> str:
    by_name = {r.setting: r for r in rows}
    fields = []
    for name, row in by_name.items():
        if name != SYNC:
            fields.append(f"acc_gap_{name}={row.acc_gap:.1f}")
    s2 = by_name.get("s2_tis")
    head = [f"acc_gap_s2_tis={s2.acc_gap:.1f}", f"speedup_s2={s2.speedup:.2f}"] if s2 else []
    sync = by_name.get(SYNC)
    tail = [f"sync_acc={100 * sync.acc_mean:.1f}", f"sync_gain={sync.gain:+.1f}"] if sync else []
    return "RESULT " + " ".join([*head, *[f for f in fields if not f.startswith("acc_gap_s2_tis")], *tail])
