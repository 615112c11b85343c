"""`psrl keys`: ZeroMQ CURVE key pairs for a bus that spans hosts (files: docs/protocol.md, Security)."""

from __future__ import annotations

from pathlib import Path

import click

from bus.errors import BusError
from bus.security import CLIENT_NAME, generate_keys


@click.group()
def keys() -> None:
    """Create CURVE keys for an authenticated, encrypted bus."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--client", "client_name", default=CLIENT_NAME, show_default=True, help="Name of the client key pair.")
@click.option("--force", is_flag=True, help="Replace existing key pairs of the same names.")
def generate(directory: Path, client_name: str, force: bool) -> None:
    """Write server and client key pairs into DIRECTORY and authorize the client."""
    if not client_name.isidentifier():
        raise click.BadParameter(f"{client_name!r} must be a plain name (letters, digits, _)", param_hint="--client")
    try:
        written = generate_keys(directory, client_name, force=force)
    except BusError as exc:
        raise click.ClickException(str(exc)) from exc
    for path in written:
        click.echo(str(path))
    click.echo(f"copy {directory} to every host of the run; keep the *.key_secret files private", err=True)
