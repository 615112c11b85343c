"""The launcher's warm spares: starting them, knowing when they are ready, handing one an actor.

Each spare is ``python -m actors.spare`` in a new session, its stdin a pipe (where the assignment
goes, and then the launcher's lifeline, as for any actor), its output appended to
``logs/spares.log`` until it becomes an actor, and a second pipe on which it says ``ready``. What
to start and which spare to use is `launch.spare_policy`; this module only does the I/O. Spares
run on the launching host (remote hosts start their replacements cold).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from actors.boot import Boot
from actors.spare import Assignment
from launch.plan import ActorSpec
from launch.process import REPO_ROOT, ActorProcess
from launch.spare_policy import SpareInfo, SparePolicy
from psrl.log import get_logger

SPARE_NICE = 10  # niceness of a warming / waiting spare: its imports yield to the run's actors


@dataclass
class SpareProcess:
    spare_id: int
    host: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes]
    ready_fd: int  # read end of the pipe the spare says "ready" on
    started_at: float
    is_ready: bool = False
    said: bytes = field(default=b"")

    def info(self) -> SpareInfo:
        return SpareInfo(self.spare_id, self.host, self.is_ready, self.started_at)


def spare_niceness() -> tuple[int, str]:
    """The niceness increment for spares, and why: a spare returns to the launcher's priority when it
    becomes an actor, which an unprivileged process may only do within its RLIMIT_NICE."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if os.geteuid() == 0 or soft == resource.RLIM_INFINITY or 20 - current <= soft:
        return SPARE_NICE, f"spares wait at niceness +{SPARE_NICE}"
    return 0, f"spares run at normal priority: RLIMIT_NICE={soft} would not let one return to niceness {current}"


class SparePool:
    """The spares of one run, on the hosts in ``warm_classes`` (host -> actor classes to warm)."""

    def __init__(self, policy: SparePolicy, warm_classes: dict[str, list[str]], log_dir: Path, threads: int) -> None:
        self.policy = policy
        self.warm_classes = warm_classes
        self.log_path = log_dir / "spares.log"
        self.threads = threads
        self.nice, why = spare_niceness()
        self.spares: dict[int, SpareProcess] = {}
        self.num_started = 0
        self.log = get_logger("psrl.launch.spares")
        if policy.per_host:
            self.log.info("warm spares", per_host=policy.per_host, hosts=sorted(warm_classes), priority=why)

    # ------------------------------------------------------------------ upkeep (every watch tick)

    def tend(self, *, run_settled: bool) -> None:
        """Notice spares that became ready or died, retire stuck ones, start new ones where due."""
        for spare in list(self.spares.values()):
            self._poll(spare)
        now = time.monotonic()
        for spare_id in self.policy.overdue(self._infos(), now):
            spare = self.spares[spare_id]
            self.log.warning("spare still warming: retired", spare=spare_id, after_s=round(now - spare.started_at))
            self.policy.on_failed(spare.host)
            self._stop(spare)
        for host in self.policy.hosts_to_fill(self._infos(), self.warm_classes, run_settled=run_settled):
            self._start(host)

    def is_full(self) -> bool:
        """Every host has its ready spares (or will get none): what a fault injector waits for."""
        return self.policy.is_full(self._infos(), self.warm_classes)

    def num_ready(self) -> int:
        return sum(1 for s in self.spares.values() if s.is_ready)

    def _infos(self) -> list[SpareInfo]:
        return [s.info() for s in self.spares.values()]

    def _poll(self, spare: SpareProcess) -> None:
        if not spare.is_ready and spare.ready_fd >= 0:
            with contextlib.suppress(BlockingIOError):
                spare.said += os.read(spare.ready_fd, 64)
            if b"ready" in spare.said:
                spare.is_ready = True
                self.policy.on_ready(spare.host)
                self.log.info("spare ready", spare=spare.spare_id, warm_s=round(time.monotonic() - spare.started_at, 2))
        code = spare.popen.poll()
        if code is not None:
            self.log.warning("spare died before use", spare=spare.spare_id, code=code, log=str(self.log_path))
            self.policy.on_failed(spare.host)
            self._forget(spare)

    def _start(self, host: str) -> None:
        self.num_started += 1
        spare_id = self.num_started
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        command = [sys.executable, "-u", "-m", "actors.spare", "--ready-fd", str(write_fd), "--nice", str(self.nice),
                   "--threads", str(self.threads), "--classes", ",".join(self.warm_classes[host]),
                   "--name", f"spare-{spare_id}"]  # fmt: skip
        try:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(REPO_ROOT),
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
                pass_fds=(write_fd,),
            )
        finally:
            os.close(write_fd)
        self.spares[spare_id] = SpareProcess(spare_id, host, popen, log, read_fd, time.monotonic())
        self.log.info("spare started", spare=spare_id, host=host)

    # ------------------------------------------------------------------ use

    def take(self, spec: ActorSpec, boot: Boot, log_path: Path) -> ActorProcess | None:
        """The actor ``boot`` names, run by a ready spare on its host; None: none to use, start it cold."""
        for spare in list(self.spares.values()):
            self._poll(spare)  # one that died since the last tick is not handed an actor
        needs_fresh = bool(boot.options.get("ld_preload"))  # a preload must be there before the interpreter
        spare_id = self.policy.pick(self._infos(), spec.host_name, needs_fresh_process=needs_fresh)
        if spare_id is None:
            return None
        spare = self.spares.pop(spare_id)
        self._close_ready_pipe(spare)
        assignment = Assignment(boot, str(log_path), os.getpriority(os.PRIO_PROCESS, 0))
        stdin = spare.popen.stdin
        if stdin is None:
            raise RuntimeError("spare stdin pipe missing")
        try:
            stdin.write((assignment.to_json() + "\n").encode())
            stdin.flush()
        except OSError as error:  # it died between the poll and the write
            self.log.warning("spare lost while assigned", spare=spare_id, error=repr(error))
            self.policy.on_failed(spare.host)
            self._stop(spare)
            return None
        self.log.info("spare assigned", spare=spare_id, actor=spec.name, incarnation=boot.incarnation)
        return ActorProcess(spec, boot.incarnation, spare.popen, time.monotonic(), spare.log, warm=True)

    # ------------------------------------------------------------------ stop

    def stop_all(self) -> None:
        """An unused spare holds nothing to save: killed at once, so a stopping run never waits on one
        (a spare still importing at low priority on a loaded host can take seconds to handle SIGTERM)."""
        spares = list(self.spares.values())
        for spare in spares:
            self._signal(spare, signal.SIGKILL)
        for spare in spares:
            self._stop(spare)

    def _stop(self, spare: SpareProcess) -> None:
        if spare.popen.poll() is None:
            self._signal(spare, signal.SIGKILL)
            spare.popen.wait()
        self._forget(spare)

    def _forget(self, spare: SpareProcess) -> None:
        self.spares.pop(spare.spare_id, None)
        if spare.popen.stdin is not None:
            with contextlib.suppress(OSError):
                spare.popen.stdin.close()
        self._close_ready_pipe(spare)
        spare.log.close()

    @staticmethod
    def _close_ready_pipe(spare: SpareProcess) -> None:
        if spare.ready_fd >= 0:  # closed once only: the number may belong to another file afterwards
            os.close(spare.ready_fd)
            spare.ready_fd = -1

    @staticmethod
    def _signal(spare: SpareProcess, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(spare.popen.pid, signum)
