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

The idle-core estimate cannot see everything: the others' use is bursty (a step's answers come at
its start, then the engines wait for the next version), so a thread more can pay even where they
use half a core on average (SmolLM2 on the demo workload: others 0.39-0.47 of 2 cores, and 2 threads
made the step 1.33x faster), while on the demo it costs 6%. So where one more thread is plausible
(the estimate leaves at least ``TRIAL_REACH`` of a core above the current count) ``ThreadTrials``
tries it for a few versions and keeps whichever count gave the shorter version interval, the run's
pace; a verdict stands for ``RETRY_AFTER`` versions, and a host that gets busier is yielded to at once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
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


TRIAL_REACH = 0.25  # try one thread more when the idle-core estimate is at least this far above the count
TRIAL_VERSIONS = 2  # version intervals measured at each count before a verdict
TRIAL_MARGIN = 0.05  # the trial's count must be this much faster (relative) to be kept
RETRY_AFTER = 25  # versions a verdict stands before the counts are compared again


@dataclass
class ThreadTrials:
    """The trainer's thread count by measurement, on top of the idle-core rule (pure: replay-friendly)."""

    num_cores: int
    intervals: dict[int, list[float]] = field(default_factory=dict)  # count -> latest version intervals
    trial: tuple[int, int] | None = None  # (count on trial, the count it is compared with)
    verdict_version: int | None = None

    def decide(self, current: int, version: int, sample: CpuSample) -> int:
        """The count for the next version, after ``version`` ended ``sample.wall_s`` after the last one."""
        rule = threads_for(self.num_cores, sample.wall_s, sample.host_busy_s, sample.own_cpu_s, current)
        if version <= 1:  # the first interval holds start-up, not a step
            return rule
        recent = self.intervals.setdefault(current, [])
        recent[:] = [*recent, sample.wall_s][-TRIAL_VERSIONS:]
        if self.trial is not None and current != self.trial[0]:
            # the count was changed from outside the trial: drop it, and let that choice stand a while
            self.trial, self.verdict_version = None, version
        if self.trial is not None:
            return self._conclude(version)
        if rule != current:  # the estimate moved past its hysteresis: a busier host is yielded to at once
            return rule
        free = self.num_cores - max(0.0, sample.host_busy_s - sample.own_cpu_s) / max(sample.wall_s, 1e-9)
        if self._may_try(current, version, free):
            self.trial = (current + 1, current)
            self.intervals[current + 1] = []
            return current + 1
        return current

    def _may_try(self, current: int, version: int, free: float) -> bool:
        settled = self.verdict_version is not None and version - self.verdict_version < RETRY_AFTER
        return (
            current < self.num_cores
            and free >= current + TRIAL_REACH
            and len(self.intervals.get(current, [])) >= TRIAL_VERSIONS
            and not settled
        )

    def _conclude(self, version: int) -> int:
        assert self.trial is not None
        tried, base = self.trial
        if len(self.intervals[tried]) < TRIAL_VERSIONS:
            return tried
        self.trial, self.verdict_version = None, version
        # the shortest interval of each: evaluations and checkpoints only ever lengthen one
        faster = min(self.intervals[tried]) < (1.0 - TRIAL_MARGIN) * min(self.intervals[base])
        return tried if faster else base
