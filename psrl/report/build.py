"""`build_report`: read a run directory and write its plots and report.html."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from psrl.config import load_config
from psrl.errors import ConfigError, MissingExtraError
from psrl.report.collect import read_timeline
from psrl.report.html import render_html
from psrl.report.inputs import NoDataError, ReportInputs
from psrl.report.summary import RunSummary, summarize

PlotFunction = Callable[[ReportInputs, Path], None]


@dataclass(frozen=True)
class PlotSpec:
    file_name: str
    title: str
    caption: str
    draw: PlotFunction


@dataclass(frozen=True)
class ReportResult:
    output: Path
    html: Path
    summary: RunSummary
    plots: dict[str, Path] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def plot_specs() -> list[PlotSpec]:
    """Every plot of a report, in page order; needs matplotlib (the `report` extra)."""
    try:
        from psrl.report.plots_certificate import plot_certificates
        from psrl.report.plots_health import plot_eval, plot_health
        from psrl.report.plots_memory import plot_memory_switches
        from psrl.report.plots_rollout import plot_utilisation, plot_version_lag
        from psrl.report.plots_training import plot_reward, plot_staleness, plot_sync_time
    except ImportError as error:
        if error.name is not None and error.name.split(".")[0] == "matplotlib":
            raise MissingExtraError("psrl report (plots)", "report", "matplotlib") from error
        raise
    return [
        PlotSpec("reward.png", "Reward and accuracy per step",
                 "Coordinator metrics reward/mean and acc/mean of the trajectories each step trained on (faint: raw, "
                 "solid: smoothed); steps finished while shutting down are left out.", plot_reward),
        PlotSpec("health.png", "Training health",
                 "KL (actor/kl_loss to the reference, actor/ppo_kl to the rollout policy), entropy, response length "
                 "and gradient norm per step, raw and smoothed.", plot_health),
        PlotSpec("eval.png", "Held-out evaluation", "val/* and eval/* metrics per step, raw and smoothed.", plot_eval),
        PlotSpec("staleness.png", "Staleness histogram",
                 "Trained trajectories by staleness (router staleness/count_k, summed over steps); "
                 "the dashed line is the configured bound.", plot_staleness),
        PlotSpec("certificates.png", "Staleness certificates",
                 "Per step, from train.certificate: trained trajectories by staleness (and how many were interrupted), "
                 "the spread of per-trajectory mean truncated importance weights, and the fraction of tokens whose "
                 "weight was clipped at the threshold or that the correction masked.", plot_certificates),
        PlotSpec("utilisation.png", "Rollout-instance utilisation",
                 "Running requests from inst.status, and the share of each time bin an instance had at least one "
                 "running request; the shaded span is the work window.", plot_utilisation),
        PlotSpec("version_lag.png", "Version lag",
                 "Latest published parameter-server version against each instance's loaded version, and their "
                 "difference; dotted lines are sync commands, dashed red lines migrations.", plot_version_lag),
        PlotSpec("sync_time.png", "Weight-sync time per phase",
                 "Trainer push phases (sync/* metrics, slowest rank) stacked with the slowest instance's pull+load "
                 "(wt.loaded load_ms); dots are the mean pull+load over instances.", plot_sync_time),
        PlotSpec("memory_switches.png", "GPU memory switches (colocated runs)",
                 "When each trainer rank and rollout instance held its GPU memory (tms.switched: bars end when a "
                 "pause began and start when a resume was done), and how long each pause and resume took.",
                 plot_memory_switches),
    ]  # fmt: skip


def staleness_bound(run: Path, problems: list[str]) -> int | None:
    """psrl.staleness from the run's config.yaml; None (and a listed problem) when it cannot be read."""
    path = run / "config.yaml"
    if not path.is_file():
        problems.append(f"{path} missing: the staleness bound is not drawn")
        return None
    try:
        return load_config(str(path)).psrl.staleness
    except ConfigError as error:
        problems.append(f"{path} does not load ({error}); the staleness bound is not drawn")
        return None


def build_report(run_dir: str | Path, output: str | Path | None = None) -> ReportResult:
    """Write the plots and report.html of ``run_dir`` into ``output`` (default ``<run_dir>/report``)."""
    run = Path(run_dir)
    if not (run / "events").is_dir():
        raise FileNotFoundError(f"{run / 'events'} does not exist: is {run} a run directory?")
    specs = plot_specs()
    out = Path(output) if output is not None else run / "report"
    out.mkdir(parents=True, exist_ok=True)
    timeline = read_timeline(run)
    problems = list(timeline.problems)
    inputs = ReportInputs(run.resolve().name, timeline, summarize(timeline), staleness_bound(run, problems))
    plots: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for spec in specs:
        try:
            spec.draw(inputs, out / spec.file_name)
        except NoDataError as reason:
            skipped[spec.title] = str(reason)
            continue
        plots[spec.title] = out / spec.file_name
    drawn = [(s.file_name, s.title, s.caption) for s in specs if s.title in plots]
    html = out / "report.html"
    page = render_html(inputs.run_name, str(run.resolve()), inputs.summary, drawn, list(skipped.items()), problems)
    html.write_text(page, encoding="utf-8")
    return ReportResult(out, html, inputs.summary, plots, skipped, problems)
