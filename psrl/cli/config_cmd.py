"""`psrl config show|docs|presets`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from psrl.config.loader import available_presets, load_config, split_preset, to_yaml
from psrl.errors import ConfigError

DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


@click.group()
def config() -> None:
    """Inspect and document the configuration."""


@config.command("show")
@click.argument("args", nargs=-1)
@click.option("--no-checks", is_flag=True, help="Skip the checks against this machine (files, model, packages, GPUs).")
def show(args: tuple[str, ...], no_checks: bool) -> None:
    """Print the fully resolved config: [PRESET] [key=value ...].

    Runs every check `psrl launch` runs before starting a process: the config rules, then the model
    directory, dataset files, reward function, optional packages and GPUs."""
    preset, overrides = split_preset(args)
    try:
        cfg = load_config(preset, overrides)
        if not no_checks:
            from psrl.preflight import checked

            cfg = checked(cfg)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    click.echo(to_yaml(cfg), nl=False)


@config.command("docs")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DOCS_PATH,
    show_default=True,
    help="Where to write the reference.",
)
@click.option("--check", is_flag=True, help="Exit non-zero if the file differs from the schema instead of writing.")
def docs(output: Path, check: bool) -> None:
    """Write docs/configuration.md from the schema."""
    from psrl.config.docs import render

    text = render()
    if check:
        current = output.read_text() if output.exists() else ""
        if current != text:
            click.echo(f"{output} is stale; run `psrl config docs`", err=True)
            sys.exit(1)
        click.echo(f"{output} is up to date")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    click.echo(f"wrote {output}")


@config.command("presets")
def presets() -> None:
    """List the available presets."""
    for name in available_presets():
        click.echo(name)
