"""The spare process on its own: it says ready once its imports are done, leaves quietly when no
longer wanted, and refuses an assignment it cannot read."""

from __future__ import annotations

import os
import subprocess
import sys

from actors.boot import Boot
from actors.spare import Assignment


def start_spare(classes: str) -> tuple[subprocess.Popen[str], int]:
    read_fd, write_fd = os.pipe()
    command = [sys.executable, "-m", "actors.spare", "--ready-fd", str(write_fd), "--classes", classes]
    spare = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, pass_fds=(write_fd,))  # fmt: skip
    os.close(write_fd)
    return spare, read_fd


def read_ready(read_fd: int) -> bytes:
    with os.fdopen(read_fd, "rb") as pipe:
        return pipe.read()


def test_a_spare_imports_its_classes_says_ready_and_retires_on_end_of_file() -> None:
    spare, read_fd = start_spare("router,tests.fakes.actors:TorchFakeActor")
    assert read_ready(read_fd) == b"ready\n"  # the spare closed its end after saying it
    out, _ = spare.communicate("", timeout=60)
    assert spare.returncode == 0, out
    assert "actors.router" in out and "torch" in out and "retired" in out


def test_a_spare_refuses_an_assignment_it_cannot_read() -> None:
    spare, read_fd = start_spare("router")
    assert read_ready(read_fd) == b"ready\n"
    out, _ = spare.communicate('{"boot": "not an object"}\n', timeout=60)
    assert spare.returncode != 0
    assert "spare assignment is not a JSON object with a boot object" in out


def test_an_assignment_round_trips() -> None:
    boot = Boot("rollout-0", "rollout", 0, 1, "run: {}", {"events_in": "ipc://x"}, options={"restarted": True})
    assignment = Assignment(boot, "/tmp/rollout-0.log", 0)
    assert Assignment.from_json(assignment.to_json()) == assignment
