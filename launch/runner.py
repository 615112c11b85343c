"""`psrl launch`: create the run directory, supervise the actors, show progress, summarise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from launch.forkserver import ForkServer
from launch.hosts import HostsFile
from launch.metrics_sink import MetricsSink
from launch.plan import plan_actors
from launch.progress import ProgressView
from launch.status_recorder import StatusRecorder
from launch.supervisor import EXIT_OK, Supervisor, resume_point
from psrl.config import Config
from psrl.errors import MissingExtraError
from psrl.launches import nothing_to_do
from psrl.rundir import RunDir


@dataclass(frozen=True)
class LaunchResult:
    """How a run ended: exit code (0 finished, 1 failed, 130 interrupted), why, and where it lives."""

    exit_code: int
    reason: str | None
    run_dir: Path

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


def run_launch(
    config: Config,
    hosts: HostsFile | None,
    *,
    name: str | None = None,
    root: str | None = None,
    actor_classes: dict[str, str] | None = None,
    quiet: bool = False,
    fork_server_ahead: ForkServer | None = None,
) -> LaunchResult:
    run_dir = RunDir.create(root or config.run.root, name or config.run.name)
    done = _nothing_to_do(config, run_dir)
    if done is not None:  # before any actor starts: a finished run's actors would wait for nothing
        click.echo(done)
        return LaunchResult(EXIT_OK, done, run_dir.path)
    options: dict[str, dict[str, Any]] = {}
    for spec in plan_actors(config, hosts):
        target = (actor_classes or {}).get(spec.role) or (actor_classes or {}).get(spec.name)
        if target:
            options[spec.name] = {"actor_class": target}
    view = ProgressView(config, echo=None if quiet else click.echo)
    sink = MetricsSink(run_dir)
    listeners: list[Any] = [view.on_event, sink.on_event]
    closers: list[Any] = [sink]
    if config.logging.wandb.enable:
        from launch.wandb_sink import WandbSink

        wandb_sink = WandbSink(config, run_dir)
        listeners.append(wandb_sink.on_event)
        closers.append(wandb_sink)
    stats = config.psrl.status_collection.stats_recorder
    if config.psrl.status_collection.enable and stats.enable:
        recorder = StatusRecorder(run_dir, stats.interval_in_s)
        listeners.append(recorder.on_event)
        closers.append(recorder)
    click.echo(f"run directory: {run_dir.path}")
    supervisor = Supervisor(
        config, run_dir, hosts, listeners=tuple(listeners), actor_options=options, fork_server_ahead=fork_server_ahead
    )
    try:
        code = supervisor.run()
    finally:
        for closer in closers:
            closer.close()
    for line in view.summary_lines():
        click.echo(line)
    _write_report(run_dir)
    verdict = "finished" if code == EXIT_OK else f"ended with exit code {code}"
    click.echo(f"run {run_dir.name} {verdict}: {supervisor.end_reason}")
    return LaunchResult(code, supervisor.end_reason, run_dir.path)


def _nothing_to_do(config: Config, run_dir: RunDir) -> str | None:
    if not config.trainer.resume:
        return None
    version = resume_point(run_dir, config.entries_per_buffer).version
    return nothing_to_do(run_dir.name, version, config.trainer.total_steps)


def _write_report(run_dir: RunDir) -> None:
    """The run's plots and report.html (a failure here never changes the run's exit code)."""
    try:
        from psrl.report.build import build_report

        click.echo(f"report: {build_report(run_dir.path).html}")
    except (MissingExtraError, FileNotFoundError, ValueError) as error:
        click.echo(f"no report: {error}")
