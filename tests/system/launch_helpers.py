"""Run the real supervisor with fake actors (real processes, real bus)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bus.eventlog.reader import EventLogReader
from launch.plan import plan_actors
from launch.supervisor import Supervisor
from psrl.config import load_config
from psrl.rundir import RunDir

FAKE = "tests.fakes.actors:FakeActor"
SMALL = [
    "topology.n_rollout_instances=2",
    "topology.n_ps_shards=1",
    "topology.n_trainer_ranks=1",
    "bus.handshake_timeout_s=60",
]


def make_supervisor(
    tmp_path: Path, options: dict[str, dict[str, Any]] | None = None, overrides: list[str] | None = None
) -> Supervisor:
    config = load_config(None, [*SMALL, *(overrides or [])])
    run_dir = RunDir.create(tmp_path / "runs", "test")
    actor_options = {spec.name: {"actor_class": FAKE} for spec in plan_actors(config) if spec.role != "logger"}
    for name, extra in (options or {}).items():
        actor_options[name].update(extra)
    return Supervisor(config, run_dir, actor_options=actor_options)


class Background:
    """Run a supervisor in a thread (signal handlers need the main thread: patched out)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import signal

        original = signal.signal
        signal.signal = lambda *_a, **_k: None  # type: ignore[assignment]
        try:
            self.code = self.supervisor.run()
        finally:
            signal.signal = original  # type: ignore[assignment]

    def start(self) -> Background:
        self.thread.start()
        return self

    def wait_ready(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            procs = self.supervisor.processes
            if procs and len(procs) == len(self.supervisor.specs) and all(p.is_ready for p in procs.values()):
                return
            time.sleep(0.1)
        raise TimeoutError("actors not ready")

    def join(self, timeout_s: float = 60) -> int | None:
        self.thread.join(timeout_s)
        return self.code


def logged_events(run_dir: RunDir) -> list[Any]:
    return [e.event for e in EventLogReader(run_dir.events).events()]


def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    """Poll ``condition()`` until it holds; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def assert_replay_agrees(run: Path) -> None:
    """`psrl replay --check all` exits 0, and every checker judged something and disagrees with nothing."""
    import subprocess
    import sys

    from psrl.replay.runner import replay_run

    replay = subprocess.run([sys.executable, "-m", "psrl.cli.main", "replay", "--check", "all", str(run)],
                            capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
    checkers = replay_run(run, ["all"]).checkers
    assert sum(c.agreement.num_agree for c in checkers) > 0
    for checker in checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])
