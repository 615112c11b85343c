"""CPU time from /proc: the host's busy seconds and one process's, and whether the host has an NVIDIA GPU
(no torch: the launcher and the checks before launch read them)."""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from pathlib import Path

PROC_STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle, iowait in the aggregate "cpu" line (after the label)


def host_busy_seconds(stat_text: str, cores: Collection[int] | None = None) -> float | None:
    """CPU seconds the host spent busy since boot, from ``/proc/stat``: the aggregate line, or the
    lines of ``cores`` only (None: unreadable)."""
    labels = {"cpu"} if cores is None else {f"cpu{core}" for core in cores}
    lines = [line.split() for line in stat_text.split("\n") if line.startswith("cpu")]
    rows = [fields for fields in lines if fields and fields[0] in labels]
    if len(rows) != len(labels):
        return None
    busy = 0
    for fields in rows:
        ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        busy += sum(ticks) - sum(ticks[i] for i in IDLE_FIELDS)
    return busy / os.sysconf("SC_CLK_TCK")


def read_host_busy_seconds(stat_path: Path = PROC_STAT, cores: Collection[int] | None = None) -> float | None:
    try:
        return host_busy_seconds(stat_path.read_text(), cores)
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


def nvidia_gpu_present() -> bool:
    """An NVIDIA driver with a device (read from /proc and /dev, without starting CUDA)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return (gpus.is_dir() and any(gpus.iterdir())) or Path("/dev/nvidia0").exists()
