"""A multi-host launch checks ssh first and shows ssh's own error on the console (launch.reach).

Regression: an unreachable host read "rollout-0 exited while starting (exit code 255)"; ssh's
message was only in logs/rollout-0.log.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launch.hosts import Host, HostsFile
from launch.reach import probe, ssh_error, unreachable

REFUSING_SSH = """#!/bin/sh
echo "Warning: a banner line" >&2
echo "ssh: connect to host $3 port 22: Connection refused" >&2
exit 255
"""


def fake_ssh(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-ssh"
    script.write_text(body)
    script.chmod(0o755)
    return str(script)


def test_ssh_error_is_its_last_lines_or_the_exit_code() -> None:
    assert ssh_error("banner\n\nssh: no route\n", 255) == "banner / ssh: no route"
    assert ssh_error("", 255) == "exit code 255, no message"


def test_probe_gives_ssh_s_own_words_and_nothing_for_a_reachable_host(tmp_path: Path) -> None:
    refused = Host("gpu-b", "10.0.0.2", {"rollout": 1}, ssh=(fake_ssh(tmp_path, REFUSING_SSH),))
    assert probe(refused) == "Warning: a banner line / ssh: connect to host gpu-b port 22: Connection refused"
    assert probe(Host("gpu-c", "10.0.0.3", {"rollout": 1}, ssh=("true",))) is None
    assert probe(Host("gpu-d", "10.0.0.4", {"rollout": 1}, ssh=(str(tmp_path / "no-such-ssh"),))) is not None


def test_only_remote_hosts_are_probed(tmp_path: Path) -> None:
    hosts = HostsFile("hosts.txt", (
        Host("here", "127.0.0.1", {"router": 1}, ssh=(fake_ssh(tmp_path, REFUSING_SSH),), is_local=True, line_no=1),
        Host("far", "10.0.0.9", {"rollout": 1}, ssh=(fake_ssh(tmp_path, REFUSING_SSH),), line_no=2),
    ))  # fmt: skip
    (line,) = unreachable(hosts)
    assert line.startswith("far (hosts.txt:2): ") and "Connection refused" in line


def test_launch_shows_the_ssh_error_and_starts_nothing(tmp_path: Path) -> None:
    ssh = fake_ssh(tmp_path, REFUSING_SSH)
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"launcher 127.0.0.1 coordinator router logger trainer ps local=true\n"
                     f"gpu-b 10.0.0.2 rollout:2 ssh={ssh}\n")  # fmt: skip
    command = [sys.executable, "-m", "psrl.cli.main", "launch", "demo", "--hosts", str(hosts),
               "--root", str(tmp_path / "runs"), "--name", "mh"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ssh: connect to host gpu-b port 22: Connection refused" in done.stderr
    assert f"{hosts}:2" in done.stderr and not (tmp_path / "runs" / "mh").exists()
