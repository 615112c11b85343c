"""How many CPU threads a trainer rank computes with (``topology.trainer_threads=auto``).

On a CPU host the trainer shares the cores with the rollout instances, the router and the rest. How
much of a step is training differs by workload: on the bundled demo the other processes keep about
0.7 of 2 cores busy, and a second trainer thread only competes with them (0.333 against 0.314 s a
step); with SmolLM2-135M and ten-token answers they keep about 0.3 busy, and a second thread makes
each step 1.33x faster. So the trainer sizes its pool after every version by what the host had
left: the cores it may run on (the launcher may have pinned it: ``launch.cpu_placement``), less
what the other processes used of those cores since the last decision (their busy time from
``/proc/stat`` minus the trainer's own CPU time), rounded to the nearest whole core, at least one. The rule is
pure (``threads_for``); ``CpuSampler`` reads the counters.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from psrl.cpu_usage import PROC_STAT, read_host_busy_seconds, whole_cores


def threads_for(num_cores: int, wall_s: float, host_busy_s: float, own_cpu_s: float, current: int | None = None) -> int:
    """The trainer's threads for the next step: the cores others left free over ``wall_s``, 1 to
    num_cores (``current`` is kept near a rounding boundary: psrl.cpu_usage.whole_cores)."""
    if wall_s <= 0:
        return 1
    others = max(0.0, host_busy_s - own_cpu_s) / wall_s
    return whole_cores(num_cores - others, current, lowest=1, highest=num_cores)


@dataclass
class CpuSample:
    wall_s: float
    host_busy_s: float  # on the cores this process may run on
    own_cpu_s: float
    cores: frozenset[int]


class CpuSampler:
    """Host and process CPU counters between two decisions."""

    def __init__(self, stat_path: Path = PROC_STAT) -> None:
        self.stat_path = stat_path
        self._last = self._read()

    @property
    def num_cores(self) -> int:
        """The cores this process may run on now (the launcher may pin it: launch.cpu_placement)."""
        return len(os.sched_getaffinity(0))

    @property
    def is_available(self) -> bool:
        return self._last is not None

    def _read(self) -> CpuSample | None:
        cores = frozenset(os.sched_getaffinity(0))
        busy = read_host_busy_seconds(self.stat_path, cores)
        return None if busy is None else CpuSample(time.monotonic(), busy, time.process_time(), cores)

    def since_last(self) -> CpuSample | None:
        """What passed on this process's cores since the previous call (or construction); None where the
        host has no /proc/stat, or where the launcher moved the process to other cores meanwhile."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now.cores != last.cores:
            return None
        return CpuSample(
            now.wall_s - last.wall_s, now.host_busy_s - last.host_busy_s, now.own_cpu_s - last.own_cpu_s, now.cores
        )
