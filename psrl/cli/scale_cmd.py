"""`psrl scale RUN rollout=+N|-N|N`: add or remove rollout instances of a running run."""

from __future__ import annotations

import sys

import click

EPILOG = """\b
Examples:
  psrl scale runs/my-run rollout=+2     start two more rollout instances
  psrl scale my-run rollout=-1          retire one (its requests continue elsewhere)
  psrl scale my-run rollout=3           run three

\b
New instances load the current weights before they serve; a removed instance drains: its
running requests continue on the others from their tokens, then it stops. The run's room is
topology.max_rollout_instances (set at launch). A refused request changes nothing.
"""


@click.command(epilog=EPILOG)
@click.argument("run")
@click.argument("spec", metavar="rollout=+N|-N|N")
@click.option("--root", default=None, help="Directory of run directories, for a run given by name (default: runs).")
@click.option(
    "--timeout", "timeout_s", type=float, default=60.0, show_default=True, help="Seconds to wait for the answer."
)
def scale(run: str, spec: str, root: str | None, timeout_s: float) -> None:
    """Change how many rollout instances a running run has."""
    from psrl.scale_request import ScaleError
    from psrl.scale_request import scale as ask

    try:
        result = ask(run, spec, root=root, timeout_s=timeout_s)
    except ScaleError as error:
        click.echo(f"psrl scale: {error}", err=True)
        sys.exit(1)
    if result.added:
        click.echo(f"run {result.run}: starting {', '.join(result.added)}")
    if result.removed:
        click.echo(f"run {result.run}: draining {', '.join(result.removed)} (their requests continue elsewhere)")
    if not result.added and not result.removed:
        click.echo(f"run {result.run}: already runs {len(result.before)} rollout instances; nothing to change")
    click.echo(f"rollout instances: {len(result.before)} -> {len(result.after)} ({', '.join(result.after)})")
