"""The Ray actor that runs one psrl actor process on its node and reports on it.

It is a plain class here (this module imports without ray); launch.cluster.ray_cluster wraps it
with ``ray.remote`` and places it in the run's placement group. It runs on its node:

* ``start``: ``python -m actors`` with the boot line on stdin (again for a replacement of an actor
  that exited: the runner and its bundle stay, no new Ray worker), the GPUs Ray gave it passed on as
  the actor's ``cuda_visible_devices``, stdout into a node-local log file;
* ``status``: the exit code (None while it runs) and the log bytes written since ``offset``, which
  the launcher copies into the run directory's log;
* ``signal``: a signal to the actor's process group.

The actor process dies with its runner (``PR_SET_PDEATHSIG``): when a node is lost, or the
launcher (the runner's owner) goes away and Ray ends its actors, nothing is left running. The
runner uses one thread (``max_concurrency=1``), so the parent-death signal is tied to a thread
that lives as long as the runner.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
LOG_CHUNK_BYTES = 1 << 20


# runs first in the child: SIGKILL when the runner dies (Linux prctl, kept across exec), then the actor
DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "try:\n"
    f"    ctypes.CDLL('libc.so.6', use_errno=True).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGKILL)})\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() == 1:\n"
    "    sys.exit('runner died before the actor started')\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


class ActorRunner:
    """One psrl actor process on this node."""

    def __init__(self, name: str, python: str | None = None, workdir: str | None = None) -> None:
        self.name = name
        self.python = python or sys.executable
        self.workdir = workdir
        self.popen: subprocess.Popen[bytes] | None = None
        log_dir = Path(tempfile.gettempdir()) / f"psrl-ray-{os.getuid()}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}-{os.getpid()}.log"

    def start(self, boot_json: str) -> dict[str, Any]:
        import ray  # inside a Ray worker

        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        boot = json.loads(boot_json)
        if gpu_ids:  # Ray's choice: the actor's device is its cuda:0
            boot.setdefault("options", {})["cuda_visible_devices"] = ",".join(gpu_ids)
        from launch.process import REPO_ROOT  # on this node: where psrl is installed here

        offset = self.log_path.stat().st_size if self.log_path.exists() else 0  # a restart appends here
        log = self.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        preload = boot.get("options", {}).get("ld_preload")
        if preload:
            env["LD_PRELOAD"] = ":".join(p for p in (str(preload), env.get("LD_PRELOAD", "")) if p)
        self.popen = subprocess.Popen(
            [self.python, "-c", DIE_WITH_PARENT, self.python, "-u", "-m", "actors"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir or str(REPO_ROOT),
            env=env,
            start_new_session=True,
        )
        log.close()
        assert self.popen.stdin is not None
        self.popen.stdin.write((json.dumps(boot) + "\n").encode())
        self.popen.stdin.flush()
        return {"pid": self.popen.pid, "node": socket.gethostname(), "log": str(self.log_path), "offset": offset}

    def status(self, offset: int) -> tuple[int | None, bytes]:
        code = self.popen.poll() if self.popen is not None else None
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return code, log.read(LOG_CHUNK_BYTES)
        except OSError:
            return code, b""

    def signal(self, signum: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signum)

    def close_stdin(self) -> None:
        if self.popen is not None and self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()


def probe_connect(address: str, port: int) -> str | None:
    """On a node: None when ``address:port`` accepts a TCP connection, else why not."""
    try:
        socket.create_connection((address, port), timeout=5).close()
    except OSError as exc:
        return f"cannot connect to {address}:{port}: {exc}"
    return None


def node_answer() -> bool:
    """A task pinned to a node: it returns at all only when the node is alive."""
    return True
