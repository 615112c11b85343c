"""Plots of the training side: reward curve, staleness histogram, weight-sync time per phase."""

from __future__ import annotations

import math
from pathlib import Path

from psrl.report.figure import finish, new_figure
from psrl.report.inputs import NoDataError, ReportInputs
from psrl.report.series import metric_by_step, staleness_histogram, sync_phases


def plot_reward(inputs: ReportInputs, path: Path) -> None:
    from psrl.report.plots_health import counted_steps, smooth

    records = inputs.timeline.metrics
    rewards = counted_steps(inputs, metric_by_step(records, "reward/mean"))  # shutdown leftovers are not steps
    if not rewards:
        raise NoDataError("no reward/mean metrics in the run")
    accuracy = counted_steps(inputs, metric_by_step(records, "acc/mean"))
    figure, (axes,) = new_figure()
    for series, marker, style, label in reward_lines(rewards, accuracy):
        steps, values = zip(*series, strict=True)
        (line,) = axes.plot(steps, values, marker=marker, markersize=3, alpha=0.35, linewidth=1, linestyle=style)
        axes.plot(
            steps, smooth(values), color=line.get_color(), linewidth=2, linestyle=style, label=f"{label}, smoothed"
        )
    axes.set_xlabel("training step")
    axes.set_ylabel("reward / accuracy (per trajectory)")
    finish(figure, path, f"{inputs.run_name}: reward and accuracy per training step")


def reward_lines(
    rewards: list[tuple[int, float]], accuracy: list[tuple[int, float]]
) -> list[tuple[list[tuple[int, float]], str, str, str]]:
    """(series, marker, line style, label) to draw. A 0/1 reward equals the accuracy at every step: one
    line, named for both, rather than a legend entry for a line hidden under the other. Otherwise the
    accuracy is dashed, so that where the two meet both stay visible."""
    reward_label = "reward (mean over the step's trajectories)"
    if (
        accuracy
        and len(accuracy) == len(rewards)
        and all(a[0] == r[0] and math.isclose(a[1], r[1], abs_tol=1e-9) for a, r in zip(accuracy, rewards, strict=True))
    ):
        return [(rewards, "o", "-", f"{reward_label} = accuracy (share correct)")]
    lines = [(rewards, "o", "-", reward_label)]
    return lines + ([(accuracy, "s", "--", "accuracy (share correct)")] if accuracy else [])


def plot_staleness(inputs: ReportInputs, path: Path) -> None:
    counts = staleness_histogram(inputs.timeline.metrics)
    if not counts:
        raise NoDataError("no staleness/count_<k> (router) or staleness/hist/<k> (trainer) metrics")
    figure, (axes,) = new_figure()
    total = sum(counts.values())
    bars = axes.bar(list(counts), list(counts.values()), width=0.6, color="tab:blue", label="trajectories trained")
    axes.bar_label(bars, labels=[f"{n / total:.0%}" for n in counts.values()], fontsize=8)
    bound = inputs.staleness_bound
    if bound is not None:
        axes.axvline(bound + 0.5, color="tab:red", linestyle="--", label=f"staleness bound = {bound}")
    axes.set_xticks(range(min(counts), max(*counts, bound or 0) + 1))
    axes.set_xlabel("staleness (trainer version - trajectory version, versions)")
    axes.set_ylabel("trajectories (count)")
    violations = sum(r.values.get("staleness/bound_violations", 0.0) for r in inputs.timeline.metrics
                     if r.sender == "router")  # fmt: skip
    finish(figure, path, f"{inputs.run_name}: staleness of trained trajectories ({total:.0f} in all, "
                         f"{violations:.0f} over the bound)")  # fmt: skip


def plot_sync_time(inputs: ReportInputs, path: Path) -> None:
    phases = sync_phases(inputs.timeline.metrics, inputs.timeline.loaded)
    if not phases:
        raise NoDataError("no sync/* metrics from the trainer and no wt.loaded events")
    versions = [p.version for p in phases]
    stack = [
        ("push: serialize", [p.serialize_ms for p in phases]),
        ("push: transfer to PS", [p.transfer_ms for p in phases]),
        ("push: commit", [p.commit_ms for p in phases]),
        ("push: other", [p.other_push_ms for p in phases]),
        ("pull + load (slowest instance)", [p.load_ms_max for p in phases]),
    ]
    figure, (axes,) = new_figure()
    bottom = [0.0] * len(phases)
    for label, values in stack:
        if any(v > 0 for v in values):
            axes.bar(versions, values, bottom=bottom, width=0.8, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    means = [p.load_ms_mean if p.num_loads else math.nan for p in phases]
    axes.plot(versions, means, "k.", markersize=5, label="pull + load, mean over instances (not stacked)")
    axes.set_xlabel("weight version")
    axes.set_ylabel("time (ms)")
    finish(figure, path, f"{inputs.run_name}: weight-sync time per version and phase")
