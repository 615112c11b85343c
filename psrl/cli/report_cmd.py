"""`psrl report RUN`: plots and report.html from a run's event log and metrics."""

from __future__ import annotations

from pathlib import Path

import click

from psrl.errors import MissingExtraError


@click.command()
@click.argument("run")
@click.option(
    "--output", "-o", type=click.Path(file_okay=False, path_type=Path), help="Where to write (default RUN/report)."
)
@click.option("--root", default="runs", show_default=True, help="Where to look for RUN when it is a run name.")
@click.option(
    "--intervals",
    is_flag=True,
    help="Print instead where each step's interval went (waiting for its batch, training, the rest) and stop.",
)
def report(*, run: str, output: Path | None, root: str, intervals: bool) -> None:
    """Write the plots (reward, staleness, utilisation, version lag, weight-sync time) and report.html of RUN.

    RUN is a run directory, or a run name under --root.
    """
    from psrl.report.build import build_report
    from psrl.rundir import resolve_run_dir

    try:
        run_dir = resolve_run_dir(run, root)
        if intervals:
            _print_intervals(run_dir.path)
            return
        result = build_report(run_dir.path, output)
    except (FileNotFoundError, MissingExtraError) as error:
        raise click.ClickException(str(error)) from error
    width = max(len(label) for label, _ in result.summary.rows())
    for label, value in result.summary.rows():
        click.echo(f"{label:<{width}}  {value}")
    for title, reason in result.skipped.items():
        click.echo(f"not drawn: {title}: {reason}", err=True)
    for problem in result.problems:
        click.echo(f"problem: {problem}", err=True)
    click.echo(f"{len(result.plots)} plots and {result.html}")


def _print_intervals(run_dir: Path) -> None:
    from psrl.report.collect import read_timeline
    from psrl.report.intervals import step_intervals, summary

    rows = step_intervals(read_timeline(run_dir))
    for row in rows:
        click.echo(row.row())
    click.echo(summary(rows))
