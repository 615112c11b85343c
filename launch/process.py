"""One actor process, started on this machine, over ssh or as a Slurm job step, with its boot line on stdin.

Locally the actor is ``python -m actors`` in a new session (so a terminal Ctrl-C reaches only
the launcher, which then shuts actors down in order). Remotely it is the same command run by
ssh (``Host.starter == "ssh"``) or by ``srun --overlap -w NODE`` (``"srun"``, launch.cluster.slurm);
the actor watches its stdin, so when the launcher or its ssh/srun client dies the actor stops
itself, and the launcher can also kill it by the pid it announced in its Hello event. Other
starters (``"ray"``: a Ray actor on the node) register in ``STARTERS``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from actors.boot import Boot
from launch.plan import ActorSpec

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout (or site-packages) holding launch/, actors/, psrl/


class Child(Protocol):
    """What the launcher uses of an actor's process: a ``Popen``, or a fork server's child."""

    @property
    def pid(self) -> int: ...

    @property
    def stdin(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


@dataclass
class ActorProcess:
    spec: ActorSpec
    incarnation: int
    popen: Child
    started_at: float
    log: IO[bytes]
    remote_pid: int | None = None
    is_ready: bool = False
    last_heartbeat: float = field(default=0.0)
    saving_since: float | None = None  # when it reported saving a checkpoint while stopping
    last_step_s: float | None = None  # a trainer's last step: a stop lets the step in flight finish
    warm: bool = False  # its imports were done ahead of need: a warm spare or a fork of the fork server

    @property
    def pid(self) -> int:
        """The actor's own pid (for a remote actor, the pid it announced on its host)."""
        if self.spec.host is not None and not self.spec.host.is_local:
            return self.remote_pid or -1
        return self.popen.pid

    @property
    def is_remote(self) -> bool:
        return self.spec.host is not None and not self.spec.host.is_local

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal(self, signum: int) -> None:
        """Signal the actor (its whole process group locally; by pid over ssh or srun remotely; through
        its runner on a Ray node)."""
        if self.popen.poll() is not None and not self.is_remote:
            return
        send = getattr(self.popen, "send_signal", None)
        if self.is_remote and self.spec.host is not None and self.spec.host.starter in STARTERS and send:
            send(signum)
            return
        if self.is_remote:
            if self.remote_pid is not None:
                run_on_host(self.spec, f"kill -{signum} {self.remote_pid} 2>/dev/null; true")
            if signum == signal.SIGKILL:
                self.popen.kill()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)

    def dump_stacks(self, log_path: Path, wait_s: float = 0.5) -> str:
        """Every thread's Python stack, which the actor writes to its log on SIGUSR1 (``actors.__main__``):
        where an actor that does not stop is stuck. Local actors only; "" when nothing came."""
        if self.is_remote or self.popen.poll() is not None:
            return ""
        try:
            start = log_path.stat().st_size
            os.kill(self.popen.pid, signal.SIGUSR1)
        except OSError:
            return ""
        time.sleep(wait_s)  # the dump is written from a signal handler, a few milliseconds at most
        with contextlib.suppress(OSError), log_path.open("rb") as log:
            log.seek(start)
            return log.read().decode(errors="replace")
        return ""

    def close_stdin(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None


# starters that are not a command line (a Ray cluster registers "ray"): spec, boot, log file -> process
STARTERS: dict[str, Callable[[ActorSpec, Boot, Path], ActorProcess]] = {}


def remote_shell(spec: ActorSpec, command: str) -> list[str]:
    """``command`` (a shell line) run on the actor's host: over its ssh command, or as a job step."""
    host = spec.host
    assert host is not None
    if host.starter == "srun":
        from launch.cluster.slurm import step_command

        return step_command(host.name, command, gpus=host.gpus if spec.name in host.devices else 0)
    return [*host.ssh, "-o", "BatchMode=yes", host.name, command]


def actor_command(spec: ActorSpec) -> list[str]:
    host = spec.host
    python = (host.python if host is not None else None) or sys.executable
    local = [python, "-u", "-m", "actors"]
    if host is None or host.is_local:
        return local
    workdir = host.workdir or str(REPO_ROOT)
    return remote_shell(spec, f"cd {shlex.quote(workdir)} && exec {' '.join(shlex.quote(p) for p in local)}")


def start_actor(spec: ActorSpec, boot: Boot, log_path: Path) -> ActorProcess:
    """Start the actor and hand it its boot line; stdin stays open as the launcher's lifeline."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if spec.host is not None and not spec.host.is_local and spec.host.starter in STARTERS:
        return STARTERS[spec.host.starter](spec, boot, log_path)
    log = log_path.open("ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    preload = boot.options.get("ld_preload")
    if preload:  # torch-memory-saver's hooks must be loaded before CUDA (psrl.tms.enable_cuda_graph)
        env["LD_PRELOAD"] = ":".join(p for p in (str(preload), env.get("LD_PRELOAD", "")) if p)
    popen = subprocess.Popen(
        actor_command(spec),
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(REPO_ROOT),
        env=env,
        start_new_session=True,
    )
    if popen.stdin is None:
        raise RuntimeError("actor stdin pipe missing")
    popen.stdin.write((boot.to_json() + "\n").encode())
    popen.stdin.flush()
    return ActorProcess(spec, boot.incarnation, popen, time.monotonic(), log)


def run_on_host(spec: ActorSpec, command: str, timeout_s: float = 10.0) -> None:
    """``command`` on the actor's host over ssh or srun; a no-op where a registered starter (Ray) owns
    the process, which it signals and kills itself."""
    host = spec.host
    if host is None or host.starter in STARTERS:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(remote_shell(spec, command), capture_output=True, timeout=timeout_s, check=False)
