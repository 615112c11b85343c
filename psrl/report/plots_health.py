"""Plots of training health: KL, entropy, response length, gradient norm, failures, held-out metrics.

Each panel shows the raw per-step values faintly and an exponential moving average over them
(`smooth`); steps the run finished while shutting down (past the last counted step) are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from psrl.report.figure import finish, new_figure
from psrl.report.inputs import NoDataError, ReportInputs
from psrl.report.series import metric_by_step

SMOOTHING = 0.6  # weight of the running average per step (0 = no smoothing)

# panel title -> metrics drawn in it (those the run has)
HEALTH_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("KL divergence", ("actor/kl_loss", "actor/ppo_kl")),
    ("rollout correction: sampler-trainer KL (k3) and tokens masked / truncated",
     ("rollout_corr/kl_k3", "rollout_corr/token_masked_frac", "rollout_corr/token_truncated_frac")),
    ("policy entropy (per token)", ("actor/entropy",)),
    ("response length (tokens)", ("response_length/mean", "response_length/max")),
    ("gradient norm (before clipping)", ("actor/grad_norm", "critic/grad_norm")),
    ("failed per step (reward calls, sessions, generations)",
     ("reward/num_errors", "reward/num_timeouts", "session/num_failed", "generation/num_failed")),
)  # fmt: skip
EVAL_PREFIXES = ("val/", "eval/")
# bookkeeping of an evaluation round, not a measure of the policy (eval/version is the x axis)
EVAL_NOT_PLOTTED = frozenset({"eval/version", "eval/num_samples", "eval/num_errors", "eval/mixed_versions",
                              "eval/duration_s", "eval/mean_length"})  # fmt: skip


def smooth(values: Sequence[float], weight: float = SMOOTHING) -> list[float]:
    """Exponential moving average, debiased so the first points are not pulled towards zero."""
    out, average, total = [], 0.0, 0.0
    for value in values:
        average = weight * average + (1 - weight) * value
        total = weight * total + (1 - weight)
        out.append(average / total if total else value)
    return out


def counted_steps(inputs: ReportInputs, series: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The series without steps finished after the run's end (shutdown leftovers)."""
    last = inputs.summary.num_steps
    return [(s, v) for s, v in series if not last or s <= last]


def plot_health(inputs: ReportInputs, path: Path) -> None:
    records = inputs.timeline.metrics
    panels = []
    for title, names in HEALTH_PANELS:
        series = {n: counted_steps(inputs, metric_by_step(records, n)) for n in names}
        series = {n: s for n, s in series.items() if s}
        if series:
            panels.append((title, series))
    if not panels:
        raise NoDataError("no KL, entropy, response-length or gradient-norm metrics in the run")
    figure, axes_list = new_figure(len(panels))
    for axes, (title, series) in zip(axes_list, panels, strict=True):
        _draw(axes, series)
        axes.set_ylabel(title, fontsize=9)
    axes_list[-1].set_xlabel("training step")
    finish(figure, path, f"{inputs.run_name}: training health per step (faint: raw, solid: smoothed)")


def plot_eval(inputs: ReportInputs, path: Path) -> None:
    records = inputs.timeline.metrics
    names = sorted({n for r in records for n in r.values if n.startswith(EVAL_PREFIXES) and n not in EVAL_NOT_PLOTTED})
    series = {n: counted_steps(inputs, metric_by_step(records, n)) for n in names}
    series = {n: s for n, s in series.items() if s}
    if not series:
        raise NoDataError("no held-out metrics (val/* or eval/*) in the run")
    figure, (axes,) = new_figure()
    _draw(axes, series)
    axes.set_xlabel("training step")
    axes.set_ylabel("held-out metric")
    finish(figure, path, f"{inputs.run_name}: held-out evaluation")


def _draw(axes: object, series: dict[str, list[tuple[int, float]]]) -> None:
    for name, points in series.items():
        steps, values = zip(*points, strict=True)
        (line,) = axes.plot(steps, values, alpha=0.3, linewidth=1)  # type: ignore[attr-defined]
        axes.plot(steps, smooth(values), color=line.get_color(), linewidth=2, label=name)  # type: ignore[attr-defined]
