"""The fork server `psrl launch` starts before it reads its configuration: taken by a run whose local
actors' classes and threads it imported, ended otherwise, never left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from launch.cli import launch
from launch.forkserver import AHEAD_CLASSES, ForkServer, ServerLog
from launch.supervisor import EXIT_OK, Supervisor
from psrl.config import load_config
from psrl.rundir import RunDir

pytestmark = pytest.mark.system


def fork_servers_of(parent: int) -> list[int]:
    """Live fork-server processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"actors.forkserver" in cmdline and int(stat[1]) == parent and stat[0] != "Z":
            found.append(int(entry.name))
    return found


def test_a_run_takes_the_server_started_ahead_and_forks_its_actors_from_it(tmp_path: Path) -> None:
    ahead = ForkServer.ahead()
    config = load_config("demo", ["trainer.total_steps=1", "topology.warm_spares=0"])
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "ahead"), fork_server_ahead=ahead)
    assert sup.run() == EXIT_OK, sup.end_reason
    assert sup.fork_server is ahead and not ahead.is_alive  # taken, and ended with the run
    assert all(p.warm for name, p in sup.processes.items() if name != "logger")
    assert (sup.run_dir.path / "logs" / "forkserver.log").exists()


def test_a_run_needing_other_threads_or_classes_ends_the_server_started_ahead(tmp_path: Path) -> None:
    ahead = ForkServer.ahead()
    assert not ahead.adopt(["rollout", "tests.fakes.actors:FakeActor"], 1, tmp_path / "log", tmp_path / "ipc")
    assert not ahead.adopt(["rollout"], 2, tmp_path / "log", tmp_path / "ipc")  # threads are set before imports
    config = load_config("demo", ["trainer.total_steps=1", "topology.warm_spares=0", "topology.threads_per_actor=2"])
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "other"), fork_server_ahead=ahead)
    assert sup.run() == EXIT_OK, sup.end_reason
    assert sup.fork_server is not ahead and not ahead.is_alive
    assert set(AHEAD_CLASSES) >= {"rollout", "ps", "trainer", "router", "coordinator"}


def test_a_launch_refused_by_its_configuration_leaves_no_fork_server(tmp_path: Path) -> None:
    result = CliRunner().invoke(launch, ["demo", "trainer.total_steps=-1", "--root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "trainer.total_steps" in result.output
    assert fork_servers_of(os.getpid()) == []


def test_the_server_log_holds_output_until_the_run_directory_exists(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    log = ServerLog(os.fdopen(read_end, "rb"), None)
    os.write(write_end, b"before the run directory\n")
    target = tmp_path / "forkserver.log"
    log.attach(target)
    os.write(write_end, b"after\n")
    os.close(write_end)
    log.close()
    assert target.read_bytes() == b"before the run directory\nafter\n"
