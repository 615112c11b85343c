"""The fork server: imports the actors' heavy modules once, then forks each local actor from them.

Every actor process imports torch and psrl's engine, trainer or parameter-server modules before it
does anything of its own; on a 2-core machine the copies of that work (some 14 CPU-seconds for the
demo's eight actors) were most of a launch's first ten seconds. The fork server pays it once, at the
launcher's priority, and a fork then starts an actor (or a replacement) with every import done.
Importing those modules starts no thread and touches no GPU, so forking after them is safe; each
child sets its threads and visible GPUs before its own work starts (``actors.__main__``).

Protocol, one JSON object per line: the launcher writes ``{"stdin": FIFO, "log": PATH}`` to the
server's stdin; the server forks a child whose stdin is that FIFO (the launcher holds its write end:
the boot line arrives there, and end-of-file means the launcher is gone, as for a cold actor) and
whose output goes to the log, then answers ``{"pid": N}`` once the child holds its FIFO. It reaps
its children and reports ``{"exit": N, "code": C}`` (C negative for a signal, as subprocess does).
It imports the classes in the order given and says ``{"ready_class": CLASS}`` after each: the
launcher then asks for that class's actors, which the server forks before it imports the next class
(a child forked then imports what it still needs itself, so on 2 cores the trainer loads its model
while the server imports the engine's modules). It says ``{"ready": [modules]}`` once every import
is done, and exits at end-of-file on its stdin; children outlive it (each has its own lifeline).

    python -m actors.forkserver --threads 1 --classes rollout,ps,trainer,router,coordinator
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
import traceback
from typing import Any, NoReturn

from actors.spare import warm_imports

POLL_S = 0.05
# after each class's imports, how long the server waits for that class's fork requests before importing the
# next (the launcher answers a ready class within milliseconds when it waits for it)
CLASS_WINDOW_S = 0.05


def _say(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _child(request: dict[str, Any], held: int) -> None:
    """In the forked child: a new session, the FIFO as stdin, the log as stdout/stderr, then the actor."""
    code = 1
    try:
        os.setsid()
        lifeline = os.open(request["stdin"], os.O_RDONLY)
        os.write(held, b"1")  # holding the FIFO: the launcher may remove its name
        os.close(held)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for fd, source in ((0, lifeline), (1, log), (2, log)):
            os.dup2(source, fd)
        os.close(lifeline)
        os.close(log)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stdin for its life
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        from actors.__main__ import main

        code = main()
    except BaseException:  # the child must never return into the server's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _fork(request: dict[str, Any]) -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(request, write_end)
    os.close(write_end)
    os.read(read_end, 1)  # the child holds its FIFO (or died trying: end-of-file)
    os.close(read_end)
    _say({"pid": pid, "id": request.get("id")})  # the launcher matches the reply to its request


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


class Requests:
    """Fork requests read from stdin, one JSON object per line."""

    def __init__(self) -> None:
        self.pending = b""

    def serve(self, quiet_s: float | None = None) -> bool:
        """Fork each request as it comes; with ``quiet_s``, return once none has come for that long (True),
        else until end-of-file on stdin (False: the launcher is gone; the children have their own lifelines)."""
        last = time.monotonic()
        while quiet_s is None or time.monotonic() - last < quiet_s:
            readable, _, _ = select.select([0], [], [], POLL_S if quiet_s is None else min(POLL_S, quiet_s))
            _reap()
            if not readable:
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return False
            self.pending += chunk
            *lines, self.pending = self.pending.split(b"\n")
            for line in lines:
                if line.strip():
                    _fork(json.loads(line))
            last = time.monotonic()
        return True


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="python -m actors.forkserver", description=__doc__)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    parser.add_argument("--classes", default="", help="actor classes to import: roles or module:Class, comma separated")
    args = parser.parse_args(argv)
    if args.threads:  # before torch is imported, as a cold start does
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    started, requests, modules = time.monotonic(), Requests(), []
    for target in (c for c in args.classes.split(",") if c):
        modules += [m for m in warm_imports([target]) if m not in modules]
        # the launcher may start this class's actors now, while the next classes import
        _say({"ready_class": target})
        if not requests.serve(quiet_s=CLASS_WINDOW_S):
            os._exit(0)
    _say({"ready": modules, "import_s": round(time.monotonic() - started, 3)})
    requests.serve()
    # Nothing here needs tearing down, and unwinding the imported torch and transformers takes about a
    # second that the launcher would wait for at the end of every run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
