"""Start-up cost: time from the launch to the first trained step, with and without the fork server.

Runs the same short launch (the demo preset, or any preset with overrides) alternating
``topology.fork_server=true`` and ``false``, ``--repeats`` times each, and reports the median time to
the first ``train.progress`` and of the whole run. Both sides pay the same logger start, model loads
and first generation; what differs is whether every actor imports its own modules (off) or forks
from one process that imported them once (on).

    python tools/bench_startup.py                       # the demo, 2 steps, 2 repeats
    python tools/bench_startup.py --repeats 3 reasoning trainer.total_steps=2

Ends with ``RESULT first_step_s=... first_step_s_cold=... whole_s=... whole_s_cold=... speedup=...``
(speedup: the cold first step over the forked one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

from bus.messages import TrainerProgress
from launch.supervisor import EXIT_OK, Supervisor
from psrl.config import load_config
from psrl.log import configure
from psrl.rundir import RunDir


def timed_launch(preset: str, overrides: list[str], fork_server: bool) -> tuple[float, float]:
    """(seconds to the first trained step, seconds of the whole run) of one launch."""
    config = load_config(preset, [*overrides, f"topology.fork_server={str(fork_server).lower()}"])
    sup = Supervisor(config, RunDir.create(tempfile.mkdtemp(prefix="psrl-startup-"), "startup"))
    started = time.monotonic()
    first: list[float] = []

    def on_event(event: Any) -> None:
        if isinstance(event.message, TrainerProgress) and not first:
            first.append(time.monotonic() - started)

    sup.listeners = (on_event,)
    code = sup.run()
    if code != EXIT_OK or not first:
        raise RuntimeError(f"the launch did not train (exit {code}: {sup.end_reason})")
    return first[0], time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="launches of each kind, alternating")
    parser.add_argument("preset", nargs="?", default="demo", help="preset name or YAML file")
    parser.add_argument("overrides", nargs="*", help="config overrides (default: 2 steps, no warm spares)")
    args = parser.parse_args()
    configure("warning")
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
