"""The launcher's side of the fork server (``actors.forkserver``): local actors forked with their imports done.

``ForkServer.start`` returns an ``ActorProcess`` like ``launch.process.start_actor`` does, or None when
the server cannot start this actor (not ready yet, gone, or an actor that needs a fresh interpreter:
an ``LD_PRELOAD`` must be there before the interpreter starts): the launcher then starts it cold.
The child is the server's, not the launcher's, so ``ForkedChild`` gives the launcher what it uses of
a ``Popen`` from the server's reports: the pid, the exit code once reaped, the stdin lifeline.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from actors.boot import Boot
from launch.plan import ActorSpec
from launch.process import REPO_ROOT, ActorProcess
from psrl.processes import pid_alive

REPLY_TIMEOUT_S = 30.0
POLL_S = 0.01


# What ``psrl launch`` imports ahead, before it has read its configuration: the classes of a local run
# (the session scheduler's too, so that agentic runs find it imported), in the order they become ready:
# the trainer's first (the longest to import and to load its model: the first step waits for it), then
# the engine's, then the light ones.
AHEAD_CLASSES = ("trainer", "rollout", "ps", "router", "coordinator", "session")


def import_order(classes: list[str]) -> list[str]:
    """``classes`` in the order a server imports them: as in AHEAD_CLASSES, any other after them."""
    rank = {name: index for index, name in enumerate(AHEAD_CLASSES)}
    return sorted(classes, key=lambda name: rank.get(name, len(rank)))


class ForkServer:
    """``log_path`` / ``fifo_dir`` None: a server started ahead of its run directory (``ahead``); its
    output is held until ``adopt`` gives it the run's."""

    def __init__(self, classes: list[str], threads: int, log_path: Path | None, fifo_dir: Path | None) -> None:
        self.classes, self.threads = import_order(list(classes)), threads
        self.fifo_dir = fifo_dir
        if fifo_dir is not None:
            fifo_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-u", "-m", "actors.forkserver", "--classes", ",".join(self.classes)]
        self.popen = subprocess.Popen(
            [*command, "--threads", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(REPO_ROOT),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        assert self.popen.stderr is not None
        self.log = ServerLog(self.popen.stderr, log_path)
        self.ready = threading.Event()  # every class imported
        self.ready_classes: set[str] = set()
        self._class_ready = threading.Condition()
        self.import_s: float | None = None
        self.exits: dict[int, int] = {}
        self._pids: queue.Queue[tuple[int | None, int]] = queue.Queue()  # (request id, pid)
        self._request_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="forkserver", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            reply: dict[str, Any] = json.loads(line)
            if "ready_class" in reply:
                with self._class_ready:
                    self.ready_classes.add(str(reply["ready_class"]))
                    self._class_ready.notify_all()
            elif "ready" in reply:
                self.import_s = float(reply.get("import_s", 0.0))
                with self._class_ready:
                    self.ready.set()
                    self._class_ready.notify_all()
            elif "pid" in reply:
                self._pids.put((reply.get("id"), int(reply["pid"])))
            elif "exit" in reply:
                self.exits[int(reply["exit"])] = int(reply["code"])

    @classmethod
    def ahead(cls) -> ForkServer:
        """A server importing a local run's usual classes, at the default threads per actor, while the
        launcher reads its configuration."""
        from psrl.config.system import Topology

        return cls(list(AHEAD_CLASSES), Topology.model_fields["threads_per_actor"].default, None, None)

    def adopt(self, classes: list[str], threads: int, log_path: Path, fifo_dir: Path) -> bool:
        """Take this server for a run that needs ``classes`` at ``threads``: True (its output now goes to
        ``log_path``) when it imports all of them at that thread count and still runs."""
        if not set(classes) <= set(self.classes) or threads != self.threads or not self.is_alive:
            return False
        fifo_dir.mkdir(parents=True, exist_ok=True)
        self.fifo_dir = fifo_dir
        self.log.attach(log_path)
        return True

    def discard(self) -> None:
        """End a server no run took (it has forked nothing): at once, mid-import or not."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        self.close()

    @property
    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def wait_ready(self, timeout_s: float) -> bool:
        return self.ready.wait(timeout_s) and self.is_alive

    def wait_class(self, target: str, timeout_s: float) -> bool:
        """Wait until ``target``'s modules are imported (the server forks its actors from then on)."""
        deadline = time.monotonic() + timeout_s
        with self._class_ready:
            while not self.is_ready_for(target) and self.is_alive and time.monotonic() < deadline:
                self._class_ready.wait(min(0.1, deadline - time.monotonic()))  # also sees a server that died
        return self.is_ready_for(target) and self.is_alive

    def is_ready_for(self, target: str | None) -> bool:
        """The server forks actors of ``target`` (any class once every import is done; None: only then)."""
        return self.ready.is_set() or (target is not None and target in self.ready_classes)

    def start(self, spec: ActorSpec, boot: Boot, log_path: Path, target: str | None = None) -> ActorProcess | None:
        """The actor forked by the server (its boot line on its FIFO), or None: start it cold. ``target``: the
        actor's class, which may be ready before the server's other imports are."""
        if boot.options.get("ld_preload") or not self.is_ready_for(target) or not self.is_alive:
            return None
        if self.fifo_dir is None:
            return None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fifo = self.fifo_dir / f"{boot.name}.{boot.incarnation}.stdin"
        with contextlib.suppress(FileNotFoundError):
            fifo.unlink()
        os.mkfifo(fifo, 0o600)
        writer = os.open(fifo, os.O_RDWR)  # never blocks, and keeps the FIFO open for the child's lifetime
        try:
            pid = self._fork(fifo, log_path)
        finally:
            fifo.unlink()
        if pid is None:
            os.close(writer)
            return None
        child = ForkedChild(pid, self, os.fdopen(writer, "wb"))
        child.stdin.write((boot.to_json() + "\n").encode())
        child.stdin.flush()
        return ActorProcess(spec, boot.incarnation, child, time.monotonic(), log_path.open("ab"), warm=True)

    def _fork(self, fifo: Path, log_path: Path) -> int | None:
        request_id = next(self._request_ids)
        request = json.dumps({"stdin": str(fifo), "log": str(log_path), "id": request_id}) + "\n"
        with self._lock:
            try:
                assert self.popen.stdin is not None
                self.popen.stdin.write(request.encode())
                self.popen.stdin.flush()
                return self._pid_of(request_id, time.monotonic() + REPLY_TIMEOUT_S)
            except (OSError, queue.Empty):
                return None

    def _pid_of(self, request_id: int, deadline: float) -> int:
        """The pid answering ``request_id``. A reply to an earlier request that timed out is skipped: its
        child lost its FIFO's writer with that request, reads end-of-file and ends by itself."""
        while True:
            answered, pid = self._pids.get(timeout=max(0.0, deadline - time.monotonic()))
            if answered == request_id:
                return pid

    def close(self) -> None:
        """Ends the server (its children go on: each has its own lifeline); again: nothing more."""
        if self.log.is_closed:
            return
        with contextlib.suppress(OSError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        try:
            self.popen.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self._reader.join(timeout=2.0)  # it ends at the server's end-of-file
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self.log.close()


class ServerLog:
    """The server's stderr, copied by a thread into its log file; held in memory until the file is
    known (a server started ahead of its run directory)."""

    def __init__(self, stream: IO[bytes], path: Path | None) -> None:
        self.is_closed = False
        self._file: IO[bytes] | None = None if path is None else path.open("ab")
        self._held: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, args=(stream,), name="forkserver-log", daemon=True)
        self._thread.start()

    def attach(self, path: Path) -> None:
        with self._lock:
            if self._file is None:
                self._file = path.open("ab")
                self._file.write(b"".join(self._held))
                self._file.flush()
                self._held.clear()

    def _copy(self, stream: IO[bytes]) -> None:
        for line in stream:
            with self._lock:
                if self._file is None:
                    self._held.append(line)
                else:
                    self._file.write(line)
                    self._file.flush()
        stream.close()

    def close(self) -> None:
        self._thread.join(timeout=2.0)  # it ends at the server's end of output
        with self._lock:
            self.is_closed = True
            if self._file is not None:
                self._file.close()


class ForkedChild:
    """What the launcher uses of a ``Popen``, for a child of the fork server."""

    def __init__(self, pid: int, server: ForkServer, stdin: IO[bytes]) -> None:
        self.pid = pid
        self.server = server
        self.stdin = stdin
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exits.get(self.pid)
        if self.returncode is None and not self.server.is_alive and not pid_alive(self.pid):
            self.returncode = -signal.SIGKILL  # reaped by init after the server went: its code is lost
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"actor pid {self.pid}", timeout or 0.0)
            time.sleep(POLL_S)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
