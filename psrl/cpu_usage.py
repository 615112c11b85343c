"""CPU time from /proc: the host's busy seconds and one process's (no torch: the launcher reads them)."""

from __future__ import annotations

import math
import os
from pathlib import Path

PROC_STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle, iowait in the aggregate "cpu" line (after the label)


def host_busy_seconds(stat_text: str) -> float | None:
    """CPU seconds the host spent busy since boot, from ``/proc/stat``'s aggregate line (None: unreadable)."""
    first = stat_text.split("\n", 1)[0].split()
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle = sum(ticks[i] for i in IDLE_FIELDS)
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def read_host_busy_seconds(stat_path: Path = PROC_STAT) -> float | None:
    try:
        return host_busy_seconds(stat_path.read_text())
    except OSError:
        return None


def process_cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds a process (all its threads) has used; None once it is gone."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# how far past a rounding boundary a measure must move before a whole-core decision changes: the use
# of a step's neighbours varies by a tenth of a core or more from one step to the next
HYSTERESIS_CORES = 0.15


def whole_cores(free: float, current: int | None, *, lowest: int, highest: int) -> int:
    """``free`` cores (a measure) as a whole count in [lowest, highest]: rounded, but ``current`` is
    kept while ``free`` stays within its rounding interval widened by HYSTERESIS_CORES."""
    rounded = max(lowest, min(highest, math.floor(free + 0.5)))
    if current is None or rounded == current:
        return rounded
    if current - 0.5 - HYSTERESIS_CORES <= free < current + 0.5 + HYSTERESIS_CORES:
        return current
    return rounded
