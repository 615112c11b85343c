"""`psrl` entry point. Sub-commands load lazily so `psrl --help` does not import torch."""

from __future__ import annotations

import importlib
import importlib.util

import click

from psrl import __version__

# command name -> "module:attribute"; a command is listed only when its module exists.
COMMANDS: dict[str, str] = {
    "config": "psrl.cli.config_cmd:config",
    "keys": "psrl.cli.keys_cmd:keys",
    "launch": "launch.cli:launch",  # the launcher sits above the actors, outside the library
    "tap": "psrl.cli.tap_cmd:tap",
    "scale": "psrl.cli.scale_cmd:scale",
    "replay": "psrl.cli.replay_cmd:replay",
    "calibrate": "psrl.cli.calibrate_cmd:calibrate",
    "report": "psrl.cli.report_cmd:report",
    "bench": "psrl.cli.bench_cmd:bench",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, target in COMMANDS.items() if _exists(target))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None or not _exists(target):
            return None
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


def _exists(target: str) -> bool:
    return importlib.util.find_spec(target.split(":", maxsplit=1)[0]) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="psrl")
def main() -> None:
    """psrl: asynchronous RL post-training for LLMs on a ZeroMQ actor bus."""


if __name__ == "__main__":
    main()
