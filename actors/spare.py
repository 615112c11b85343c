"""A warm spare: an actor process started ahead of need, that becomes a dead actor's replacement.

A cold replacement pays the interpreter start and its imports (torch alone takes seconds on a
busy 2-core machine) before its own setup. A spare pays them while nothing has failed, at a low
CPU priority, then waits on its stdin. Its assignment is one JSON line (`Assignment`): the boot
line a cold process would have read, where its output goes, and the priority to return to. It
then runs the same boot path as a cold start (`actors.__main__.run_boot`); stdin stays open as
the launcher's lifeline, exactly as for a cold actor. End-of-file before an assignment means the
spare is no longer wanted: it exits 0.

    python -m actors.spare --ready-fd 5 --nice 10 --threads 1 --classes rollout,ps,tests.fakes.actors:FakeActor

Once its imports are done the spare writes ``ready`` to ``--ready-fd`` (a pipe to the launcher).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

from actors.boot import Boot


@dataclass(frozen=True)
class Assignment:
    boot: Boot
    log_path: str  # the actor's log file: the spare's output goes there from now on
    nice: int  # the actor's CPU priority (the launcher's own), restored from the spare's low one

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Assignment:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("boot"), dict):
            raise ValueError("spare assignment is not a JSON object with a boot object")
        return cls(Boot(**data["boot"]), str(data["log_path"]), int(data["nice"]))


def warm_imports(targets: list[str]) -> list[str]:
    """Import each actor class (role or ``module:Class``) and the modules its ``WARM_IMPORTS`` names;
    returns every module imported, in order."""
    from actors.registry import actor_class

    done: list[str] = []
    for target in targets:
        cls = actor_class(target)
        for module in (cls.__module__, *getattr(cls, "WARM_IMPORTS", ())):
            if module not in done:
                importlib.import_module(module)
                done.append(module)
    return done


def become(assignment: Assignment) -> None:
    """Take the actor's priority and log file (the rest of its process setup is the boot path's)."""
    if os.getpriority(os.PRIO_PROCESS, 0) != assignment.nice:
        # raises PermissionError where the launcher misjudged that the priority can be restored:
        # the actor then dies at once and is started cold, never run at the spare's low priority
        os.setpriority(os.PRIO_PROCESS, 0, assignment.nice)
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(assignment.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m actors.spare", description=__doc__)
    parser.add_argument("--ready-fd", type=int, required=True, help="pipe to write 'ready' to once warm")
    parser.add_argument("--nice", type=int, default=0, help="niceness increment while warming and waiting")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    parser.add_argument("--classes", default="", help="actor classes to warm: roles or module:Class, comma separated")
    parser.add_argument("--name", default="spare", help="name in the spare's own log lines")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.nice:
        os.nice(args.nice)
    if args.threads:  # before torch is imported, as a cold start does
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    started = time.monotonic()
    modules = warm_imports([t for t in args.classes.split(",") if t])
    print(f"{args.name}: warm in {time.monotonic() - started:.2f} s ({', '.join(modules)})", flush=True)
    os.write(args.ready_fd, b"ready\n")
    os.close(args.ready_fd)
    line = sys.stdin.readline()
    if not line:
        print(f"{args.name}: retired", flush=True)
        return 0
    assignment = Assignment.from_json(line)
    print(f"{args.name}: becomes {assignment.boot.name} (incarnation {assignment.boot.incarnation})", flush=True)
    become(assignment)
    from actors.__main__ import run_boot

    return run_boot(assignment.boot)


if __name__ == "__main__":
    sys.exit(main())
