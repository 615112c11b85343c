"""A run's config and key directory are the owner's alone."""

from __future__ import annotations

import stat
from pathlib import Path

from bus.security import generate_keys
from psrl.rundir import RunDir


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_config_and_keys_are_written_owner_only(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r")
    run.config.write_text("old: 1\n")
    run.config.chmod(0o644)
    run.write_config("run:\n  name: r\n")
    assert _mode(run.config) == 0o600 and run.config.read_text() == "run:\n  name: r\n"
    assert _mode(run.keys) == 0o700
    generate_keys(run.keys)
    secrets = list(run.keys.glob("*.key_secret"))
    assert secrets and all(_mode(p) & 0o077 == 0 for p in secrets)
