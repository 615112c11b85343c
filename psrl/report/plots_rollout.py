"""Plots of the rollout side: per-instance utilisation and version lag over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator, PercentFormatter

from psrl.report.figure import MAX_LEGEND_ENTRIES, TIME_LABEL, finish, new_figure
from psrl.report.inputs import NoDataError, ReportInputs
from psrl.report.series import binned_mean, busy_series, nice_bin_seconds, ps_versions, version_lag
from psrl.report.summary import work_window
from psrl.report.timeline import RunTimeline

_LINE_STYLES = ("-", "--", "-.", ":")


def plot_utilisation(inputs: ReportInputs, path: Path) -> None:
    line = inputs.timeline
    if not line.status:
        raise NoDataError("no inst.status events in the run")
    first = min(samples[0].time for samples in line.status.values())
    last = max(samples[-1].time for samples in line.status.values())
    bin_s = nice_bin_seconds(last - first)
    figure, (running_axes, busy_axes) = new_figure(2)
    many = len(line.status) > MAX_LEGEND_ENTRIES
    _draw_running(running_axes, line, first, last, bin_s, many)
    if many:
        _draw_busy_heatmap(busy_axes, line, first, last, bin_s)
    else:
        for index, (name, samples) in enumerate(sorted(line.status.items())):
            bins = busy_series(samples, first, last, bin_s)
            times = [line.relative(t) for t, _ in bins] + [line.relative(last)]
            fractions = [f for _, f in bins] + [bins[-1][1] if bins else 0.0]
            busy_axes.step(times, fractions, where="post", label=name, linestyle=_LINE_STYLES[index % 4])
        busy_axes.set_ylim(-0.02, 1.05)
        busy_axes.yaxis.set_major_formatter(PercentFormatter(1.0))
        busy_axes.set_ylabel(f"busy fraction (per {bin_s:g} s)")
    _shade_work_window(running_axes, busy_axes, line)
    _mark_run_end(line, running_axes, busy_axes)
    busy_axes.set_xlabel(TIME_LABEL)
    finish(figure, path, f"{inputs.run_name}: rollout-instance utilisation")


def _draw_running(axes: Axes, line: RunTimeline, first: float, last: float, bin_s: float, many: bool) -> None:
    if many:
        totals: dict[float, float] = {}
        for samples in line.status.values():
            for lower, mean in binned_mean(samples, first, last, bin_s, lambda s: float(s.num_running)):
                totals[lower] = totals.get(lower, 0.0) + mean
        axes.step([line.relative(t) for t in totals], list(totals.values()), where="post", label="all instances")
        axes.set_ylabel(f"running requests (sum, mean per {bin_s:g} s)")
        return
    for index, (name, samples) in enumerate(sorted(line.status.items())):
        times = [line.relative(s.time) for s in samples]
        running = [s.num_running for s in samples]
        axes.step(times, running, where="post", label=f"{name} running", linestyle=_LINE_STYLES[index % 4])
    axes.set_ylabel("running requests")


def _draw_busy_heatmap(axes: Axes, line: RunTimeline, first: float, last: float, bin_s: float) -> None:
    names = line.instances
    rows = [[f for _, f in busy_series(line.status[name], first, last, bin_s)] for name in names]
    extent = (line.relative(first), line.relative(first) + bin_s * len(rows[0]), len(names) - 0.5, -0.5)
    image = axes.imshow(rows, aspect="auto", extent=extent, vmin=0.0, vmax=1.0, cmap="viridis", interpolation="none")
    axes.set_ylabel("instance (index)")
    colorbar = axes.figure.colorbar(image, ax=axes, pad=0.01)
    colorbar.set_label(f"busy fraction (per {bin_s:g} s)")


def _shade_work_window(top: Axes, bottom: Axes, line: RunTimeline) -> None:
    start, end = work_window(line)
    for axes in (top, bottom):
        axes.axvspan(line.relative(start), line.relative(end), color="tab:green", alpha=0.06)
    top.axvspan(line.relative(start), line.relative(start), color="tab:green", alpha=0.3, label="work window")


def plot_version_lag(inputs: ReportInputs, path: Path) -> None:
    line = inputs.timeline
    if not line.status and not line.published:
        raise NoDataError("no inst.status and no wt.published events in the run")
    initial = min((samples[0].weight_version for samples in line.status.values()), default=None)
    ps_changes = ps_versions(line.published, line.start, initial)
    figure, (version_axes, lag_axes) = new_figure(2)
    if ps_changes:
        times = [line.relative(t) for t, _ in ps_changes] + [line.relative(line.end)]
        versions = [v for _, v in ps_changes] + [ps_changes[-1][1]]
        version_axes.step(times, versions, where="post", color="black", linewidth=2, label="parameter server (latest)")
    many = len(line.status) > MAX_LEGEND_ENTRIES
    for index, (name, samples) in enumerate(sorted(line.status.items())):
        label = name if not many else ("instances" if index == 0 else None)
        style: dict[str, Any] = {"linewidth": 0.8, "alpha": 0.5, "color": "tab:blue"} if many else {}
        if not many:  # instances often hold the same version: distinct dashes keep every line visible
            style = {"linestyle": _LINE_STYLES[index % 4], "linewidth": 1.6}
        times = [line.relative(s.time) for s in samples]
        version_axes.step(times, [s.weight_version for s in samples], where="post", label=label, **style)
        lags = version_lag(samples, ps_changes)
        lag_axes.step([line.relative(t) for t, _ in lags], [lag for _, lag in lags], where="post", label=label, **style)
    _mark_syncs_and_migrations(inputs.timeline, version_axes, lag_axes)
    _mark_run_end(line, version_axes, lag_axes)
    version_axes.set_ylabel("weight version")
    for axes in (version_axes, lag_axes):
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    lag_axes.set_ylabel("lag (versions behind the PS)")
    lag_axes.set_xlabel(TIME_LABEL)
    finish(figure, path, f"{inputs.run_name}: version lag of the rollout instances")


def _mark_syncs_and_migrations(line: RunTimeline, *axes_list: Axes) -> None:
    for axes in axes_list:
        for index, mark in enumerate(line.syncs):
            label = f"sync command ({len(line.syncs)})" if index == 0 and axes is axes_list[0] else None
            axes.axvline(line.relative(mark.time), color="grey", linestyle=":", linewidth=0.9, label=label)
        for index, migration in enumerate(line.migrations):
            label = f"migration ({len(line.migrations)})" if index == 0 and axes is axes_list[0] else None
            axes.axvline(line.relative(migration.time), color="tab:red", linestyle="--", linewidth=0.9, label=label)


def _mark_run_end(line: RunTimeline, *axes_list: Axes) -> None:
    if line.run_end is None:
        return
    for axes in axes_list:
        label = "run end" if axes is axes_list[0] else None
        axes.axvline(line.relative(line.run_end.time), color="black", linestyle="-.", linewidth=1.0, label=label)
