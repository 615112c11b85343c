"""Plots of the staleness certificates (``train.certificate``): per-step staleness, importance weights and
the share of tokens the rollout correction clipped or masked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from psrl.report.figure import finish, new_figure
from psrl.report.inputs import NoDataError, ReportInputs


def plot_certificates(inputs: ReportInputs, path: Path) -> None:
    certs = inputs.timeline.certificates
    if not certs:
        raise NoDataError("no train.certificate events in the run")
    figure, (stale_axes, weight_axes, clip_axes) = new_figure(3)
    steps = [c.version for c in certs]
    levels = sorted({s for c in certs for s in c.staleness})
    bottom = np.zeros(len(certs))
    for level in levels:
        counts = np.asarray([sum(1 for s in c.staleness if s == level) for c in certs], float)
        stale_axes.bar(steps, counts, bottom=bottom, width=0.8, label=f"staleness {level}")
        bottom += counts
    interrupted = [c.num_interrupted for c in certs]
    stale_axes.plot(steps, interrupted, color="black", marker=".", linewidth=1, label="interrupted (partial rollout)")
    stale_axes.set_ylabel("trajectories", fontsize=9)
    means = [np.asarray(c.is_mean, float) for c in certs]
    if any(np.isfinite(m).any() for m in means):
        bands = [np.nanpercentile(m, [10, 50, 90]) if np.isfinite(m).any() else [np.nan] * 3 for m in means]
        low, mid, high = (np.asarray(b) for b in zip(*bands, strict=True))
        weight_axes.fill_between(steps, low, high, alpha=0.3, label="10-90% of trajectories")
        weight_axes.plot(steps, mid, linewidth=2, label="median trajectory")
        clipped = [float(np.nanmean(c.is_clipped_frac)) if np.isfinite(c.is_clipped_frac).any() else np.nan
                   for c in certs]  # fmt: skip
        clip_axes.plot(steps, clipped, marker=".", label="mean clipped fraction of tokens")
    masked = [_finite_mean(c.masked_frac) for c in certs]
    if np.isfinite(masked).any():
        clip_axes.plot(steps, masked, marker="x", label="mean masked fraction of tokens (rejection)")
    weight_axes.set_ylabel("mean TIS weight per trajectory", fontsize=9)
    clip_axes.set_ylabel("clipped / masked fraction", fontsize=9)
    clip_axes.set_xlabel("version produced (training step)")
    correction = certs[-1].correction
    label = f", correction {correction}" if correction else ""
    finish(figure, path, f"{inputs.run_name}: staleness certificates ({len(certs)} steps{label})")


def _finite_mean(values: tuple[float, ...]) -> float:
    finite = np.asarray(values, float)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if len(finite) else np.nan
