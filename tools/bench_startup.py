"""Start-up cost: time from the launch to the first trained step, with and without the fork server.

Runs the same short ``psrl launch`` (the demo preset, or any preset with overrides) as a user does, a
fresh command each time, alternating ``topology.fork_server=true`` and ``false``, ``--repeats`` times
each, and reports the median time from the command's start to the first ``train.progress`` in the
run's event log, and of the whole command. Both sides pay the same CLI, logger start, model loads and
first generation; what differs is whether every actor imports its own modules (off) or forks from
one process that imported them once, started by the command before it read its configuration (on).

    python tools/bench_startup.py                       # the demo, 2 steps, 2 repeats
    python tools/bench_startup.py --repeats 3 reasoning trainer.total_steps=2

Ends with ``RESULT first_step_s=... first_step_s_cold=... whole_s=... whole_s_cold=... speedup=...``
(speedup: the cold first step over the forked one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bus.eventlog.reader import EventLogReader
from bus.messages import TrainerProgress

REPO_ROOT = Path(__file__).resolve().parents[1]


def timed_launch(preset: str, overrides: list[str], fork_server: bool) -> tuple[float, float]:
    """(seconds from the command's start to the first trained step, seconds of the whole command)."""
    root = Path(tempfile.mkdtemp(prefix="psrl-startup-"))
    switch = f"topology.fork_server={str(fork_server).lower()}"
    command = [sys.executable, "-m", "psrl.cli.main", "launch", preset, *overrides, switch,
               "--root", str(root), "--name", "startup", "--quiet"]  # fmt: skip
    started_ns, started = time.time_ns(), time.monotonic()
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    whole = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"the launch did not train (exit {done.returncode}): {done.stderr[-2000:]}")
    for logged in EventLogReader(root / "startup" / "events").events():
        if logged.event.envelope.kind == TrainerProgress.KIND:
            return (logged.event.envelope.wall_ns - started_ns) / 1e9, whole
    raise RuntimeError(f"the launch logged no trained step: {root / 'startup'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="launches of each kind, alternating")
    parser.add_argument("preset", nargs="?", default="demo", help="preset name or YAML file")
    parser.add_argument("overrides", nargs="*", help="config overrides (default: 2 steps, no warm spares)")
    args = parser.parse_args()
    overrides = args.overrides or ["trainer.total_steps=2", "topology.warm_spares=0"]
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(args.repeats):
        for fork_server in (False, True):
            first, whole = timed_launch(args.preset, overrides, fork_server)
            results[fork_server].append((first, whole))
            print(f"fork_server={fork_server!s:<5} first_step_s={first:6.2f} whole_s={whole:6.2f}", flush=True)
    forked = [statistics.median(x) for x in zip(*results[True], strict=True)]
    cold = [statistics.median(x) for x in zip(*results[False], strict=True)]
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"RESULT first_step_s={forked[0]:.2f} first_step_s_cold={cold[0]:.2f} whole_s={forked[1]:.2f} "
          f"whole_s_cold={cold[1]:.2f} speedup={cold[0] / forked[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
