"""`psrl` entry point: the front door, above the launcher (the import contract's top layer).

Sub-commands load when they are called, so `psrl --help` does not import torch: each is a function
that imports its module (plain imports, which the import contract sees).
"""

from __future__ import annotations

from collections.abc import Callable

import click

from psrl import __version__


def _config() -> click.Command:
    from psrl.cli.config_cmd import config

    return config


def _keys() -> click.Command:
    from psrl.cli.keys_cmd import keys

    return keys


def _launch() -> click.Command:
    from launch.cli import launch

    return launch


def _tap() -> click.Command:
    from psrl.cli.tap_cmd import tap

    return tap


def _scale() -> click.Command:
    from psrl.cli.scale_cmd import scale

    return scale


def _replay() -> click.Command:
    from psrl.cli.replay_cmd import replay

    return replay


def _calibrate() -> click.Command:
    from psrl.cli.calibrate_cmd import calibrate

    return calibrate


def _report() -> click.Command:
    from psrl.cli.report_cmd import report

    return report


COMMANDS: dict[str, Callable[[], click.Command]] = {
    "config": _config,
    "keys": _keys,
    "launch": _launch,
    "tap": _tap,
    "scale": _scale,
    "replay": _replay,
    "calibrate": _calibrate,
    "report": _report,
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        load = COMMANDS.get(cmd_name)
        return None if load is None else load()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="psrl")
def main() -> None:
    """psrl: asynchronous RL post-training for LLMs on a ZeroMQ actor bus."""


if __name__ == "__main__":
    main()
