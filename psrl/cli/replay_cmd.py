"""`psrl replay RUN`: the timeline of a recorded run and its decision checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bus.plain import readable
from psrl.errors import ConfigError


class _ReplayCommand(click.Command):
    """Its help ends with the registered checkers (imported only when help is shown)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from psrl.replay import available_checkers

        with formatter.section("Checkers (--check NAME, or --check all)"):
            formatter.write_dl([(name, _summary(cls)) for name, cls in available_checkers().items()])


def _summary(cls: type) -> str:
    """A checker's first docstring line."""
    return (cls.__doc__ or "").strip().split("\n", 1)[0]


@click.command(cls=_ReplayCommand)
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@click.option("--check", "checks", multiple=True, help="Run a decision checker (repeatable; 'all' = every one).")
@click.option(
    "--what-if", "what_if", multiple=True, help="key=value override: report which checked decisions would change."
)
@click.option("--list-checkers", is_flag=True, help="List the registered checkers and exit (no RUN_DIR needed).")
def replay(
    *, run_dir: Path | None, as_json: bool, checks: tuple[str, ...], what_if: tuple[str, ...], list_checkers: bool
) -> None:
    """Summarize RUN_DIR/events and check recorded decisions.

    Exit status 1 when a checker disagrees with a recorded decision (under the run's own config).
    """
    from psrl.replay import ReplayError, available_checkers, replay_run
    from psrl.replay.render import render_report

    if list_checkers:
        for name, cls in available_checkers().items():
            decisions = ", ".join(kind or "every event" for kind in cls.decisions)
            click.echo(f"{name:<10} decisions: {decisions:<30} {_summary(cls)}")
        return
    if run_dir is None:
        raise click.UsageError("Missing argument 'RUN_DIR' (only --list-checkers goes without one).")
    if what_if and not checks:
        raise click.UsageError("--what-if needs at least one --check")
    try:
        report = replay_run(run_dir, checks, what_if)
    except (ReplayError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(readable(report.to_json()), indent=1, default=str))
    else:
        click.echo(render_report(report))
    if any(c.agreement.num_disagree for c in report.checkers):
        sys.exit(1)
