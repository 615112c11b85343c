"""The env worker processes of a session scheduler, found from the outside (Linux ``/proc``).

Env workers are children of the session actor's process started with multiprocessing's ``spawn``
(their command line runs ``spawn_main``); the same process also has multiprocessing's resource
tracker as a child, which is not a worker. Used by the chaos harness to pick a worker to kill.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def children(pid: int) -> list[int]:
    """The live (not zombie) child processes of ``pid``; empty when it is gone."""
    found: set[int] = set()
    for tasks in (PROC / str(pid) / "task").glob("*/children"):
        try:
            found.update(int(p) for p in tasks.read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(p for p in found if not _is_zombie(p))


def env_workers(pid: int) -> list[int]:
    """The env worker processes of the session actor ``pid``, in pid order."""
    return [p for p in children(pid) if b"spawn_main" in _cmdline(p)]


def _cmdline(pid: int) -> bytes:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _is_zombie(pid: int) -> bool:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")
