"""`psrl launch [PRESET] [OVERRIDES...] [--hosts hosts.txt]`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from launch.hosts import Host, HostsFile
from psrl.config import Config
from psrl.config.loader import split_preset
from psrl.errors import ConfigError

if TYPE_CHECKING:
    from launch.forkserver import ForkServer

EPILOG = """\b
Examples:
  psrl launch                              the demo (preset 'demo') on this machine
  psrl launch reasoning psrl.staleness=1   a preset with dotted overrides
  psrl launch demo --hosts hosts.txt       actors placed on several hosts over ssh
  psrl launch demo --cluster ray           on the Ray cluster this machine belongs to
  psrl launch demo --cluster slurm         inside a Slurm allocation (sbatch/salloc), job steps per node

\b
PRESET is a name from configs/ (see `psrl config presets`) or a path to a YAML file;
OVERRIDES are key=value pairs exactly as in docs/configuration.md.
The hosts file has one host per line: NAME [ADDRESS] ROLE[:COUNT]... [python=..] [ssh=..]
[workdir=..] [local=true]; roles are coordinator, router, logger, session, trainer, ps and
rollout; '#' starts a comment (format: launch/hosts.py).
"""


@click.command(epilog=EPILOG)
@click.argument("args", nargs=-1)
@click.option(
    "--hosts",
    "hosts_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Place actors on several hosts (started over ssh; CURVE encryption on).",
)
@click.option(
    "--cluster",
    metavar="ray[:ADDRESS]|slurm",
    default=None,
    help="Place actors on a Ray cluster (placement group; the ray extra) or the current Slurm allocation "
    "(job steps); sets topology.cluster.",
)
@click.option("--name", help="Run name (default: a timestamp); an existing run is resumed.")
@click.option("--root", default=None, help="Directory of run directories (default: run.root, 'runs').")
@click.option(
    "--actor-class",
    "actor_classes",
    multiple=True,
    metavar="ROLE=MODULE:CLASS",
    help="Run a role with another actor class (extensions and tests).",
)
@click.option("--quiet", is_flag=True, help="No progress lines on the console.")
def launch(
    args: tuple[str, ...],
    hosts_file: Path | None,
    cluster: str | None,
    name: str | None,
    root: str | None,
    actor_classes: tuple[str, ...],
    quiet: bool,
) -> None:
    """Start a run: bus, logger, parameter server, rollout instances, trainer, router, coordinator."""
    with _fork_server_ahead(hosts_file, cluster) as ahead:
        from launch.hosts import HostsFileError, parse_hosts_file
        from launch.plan import hosts_overrides
        from launch.runner import run_launch
        from psrl.config import load_config
        from psrl.log import configure
        from psrl.preflight import checked

        preset, overrides = split_preset(args)
        preset = preset or "demo"
        try:
            hosts = parse_hosts_file(hosts_file) if hosts_file is not None else None
            cluster_override = [f"topology.cluster={cluster}"] if cluster else []
            config = load_config(preset, [*(hosts_overrides(hosts) if hosts else []), *overrides, *cluster_override])
            on_cluster = config.topology.cluster is not None
            if on_cluster and hosts is not None:
                click.echo(
                    "--hosts and --cluster (topology.cluster) both place the actors; fix: use one of them", err=True
                )
                sys.exit(2)
            config = checked(config, spans_hosts=on_cluster or (hosts is not None and hosts.spans_hosts))
        except (ConfigError, HostsFileError) as exc:
            click.echo(str(exc), err=True)
            sys.exit(2)
        configure(config.run.log_level)
        classes = dict(item.split("=", 1) for item in actor_classes)
        if config.topology.cluster is not None:
            sys.exit(_launch_on_cluster(config, config.topology.cluster, name, root, classes, quiet))
        if hosts is not None:
            _exit_if_unreachable(hosts)
        result = run_launch(
            config, hosts, name=name, root=root, actor_classes=classes, quiet=quiet, fork_server_ahead=ahead
        )
        sys.exit(result.exit_code)


@contextlib.contextmanager
def _fork_server_ahead(hosts_file: Path | None, cluster: str | None) -> Iterator[ForkServer | None]:
    """The fork server of a local run, importing the actors' modules while the configuration is read and
    checked (about a second on 2 cores); the run takes it if its actors' classes and threads fit. Ended
    on the way out: a run that took it has closed it by then, one that did not never will."""
    if hosts_file is not None or cluster is not None:
        yield None
        return
    from launch.forkserver import ForkServer

    ahead = ForkServer.ahead()
    try:
        yield ahead
    finally:
        ahead.discard()


def _launch_on_cluster(
    config: Config, target: str, name: str | None, root: str | None, classes: dict[str, str], quiet: bool
) -> int:
    """Hosts from the cluster, held while the run lasts; a cluster that cannot run it: exit 2, nothing started."""
    from launch.cluster import ClusterError, open_cluster, parse_target
    from launch.runner import run_launch
    from psrl.errors import MissingExtraError

    try:
        with open_cluster(parse_target(target), config) as hosts:
            click.echo(f"{hosts.path}: " + "; ".join(_host_line(h) for h in hosts.hosts))
            return run_launch(config, hosts, name=name, root=root, actor_classes=classes, quiet=quiet).exit_code
    except (ClusterError, MissingExtraError) as exc:
        click.echo(f"cannot launch on {target}: {exc}", err=True)
        return 2


def _host_line(host: Host) -> str:
    roles = " ".join(f"{r}:{n}" for r, n in host.roles.items())
    return f"{host.name} {host.address} {roles}"


def _exit_if_unreachable(hosts: HostsFile) -> None:
    """Refuse to start when ssh cannot reach a host, with ssh's own error (before any actor starts)."""
    from launch.reach import unreachable

    problems = unreachable(hosts)
    if problems:
        click.echo(f"cannot reach {len(problems)} host(s) over ssh; nothing was started:", err=True)
        for line in problems:
            click.echo(f"  {line}", err=True)
        sys.exit(1)
