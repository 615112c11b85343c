"""Env workers found from the outside: the spawned children of a process, not its resource tracker."""

from __future__ import annotations

import multiprocessing
import os
import time

from launch.env_workers import children, env_workers


def found_once_started(pid: int, expected: int, timeout_s: float = 30.0) -> list[int]:
    """A spawned child shows its worker command line only once it has exec'd (slow on a busy machine)."""
    deadline = time.monotonic() + timeout_s
    while len(found := env_workers(pid)) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_spawned_workers_are_found_and_a_killed_one_is_gone_once_reaped() -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=time.sleep, args=(60,), daemon=True) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        found = found_once_started(os.getpid(), len(workers))
        assert sorted(w.pid for w in workers) == found
        assert set(found) <= set(children(os.getpid()))
        workers[0].kill()
        workers[0].join(5)
        assert env_workers(os.getpid()) == [workers[1].pid]
    finally:
        for worker in workers:
            worker.kill()
            worker.join(5)
    assert env_workers(os.getpid()) == []
    assert env_workers(2**22 + 1) == []  # no such process
