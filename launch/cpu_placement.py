"""Which cores the trainer and the other actors run on, on a CPU-only host (``topology.cpu_placement``).

Measured on the demo (2 cores): the other actors keep about 0.7 of a core busy and the machine has
half a core idle, yet the trainer gets only 0.8 of a core: eight processes wake up all the time
(token streams, status, heartbeats, ZeroMQ's I/O threads) and each wake-up on the trainer's core
preempts its step. Pinning the trainer to a core of its own and the others to the rest took a step
from 0.272 to 0.227 s. So after every version the launcher plans: the trainer gets the cores the
others leave free (the cores less their measured use, rounded, at least one, and at least one core
left to them), the others get the rest, and the trainer computes with one thread per core it holds.

Only where it is safe to own the machine: every actor is local, and the run accounts for the
host's CPU use (another job's load switches the plan off, and every process gets every core back).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psrl.config import Config
from psrl.config.rules import cpu_placement_blockers
from psrl.cpu_usage import (
    HYSTERESIS_CORES,
    nvidia_gpu_present,
    process_cpu_seconds,
    read_host_busy_seconds,
    whole_cores,
)

# the host's busy time outside the run, in cores, above which the machine counts as shared
SHARED_HOST_CORES = 0.3


@dataclass(frozen=True)
class CorePlan:
    trainer: tuple[int, ...]
    others: tuple[int, ...]


def plan_cores(
    cores: Sequence[int],
    others_busy: float,
    outside_busy: float,
    *,
    current: CorePlan | None = None,
    yields_to_others: bool = True,
) -> CorePlan | None:
    """The split for the next version (None: no pinning). ``others_busy``: cores the run's other
    actors used; ``outside_busy``: cores used by processes outside the run (with
    ``yields_to_others``, a shared host gets no plan). Others that need less than half a core get no
    core of their own: the trainer takes every core and shares them. Near a rounding boundary the
    current split is kept (psrl.cpu_usage.whole_cores)."""
    # a plan in force is kept through the same margin as the core counts', so one noisy sample does not flap it
    shared_above = SHARED_HOST_CORES + (HYSTERESIS_CORES if current is not None else 0.0)
    if len(cores) < 2 or (yields_to_others and outside_busy > shared_above):
        return None
    ordered = sorted(cores)
    held = len(current.trainer) if current is not None else len(ordered)
    trainer_count = whole_cores(len(ordered) - others_busy, held, lowest=1, highest=len(ordered))
    if trainer_count >= len(ordered):
        return None
    return CorePlan(tuple(ordered[:trainer_count]), tuple(ordered[trainer_count:]))


def pin(pid: int, cores: Sequence[int]) -> bool:
    """Every thread of ``pid`` onto ``cores`` (threads started later inherit their starter's set)."""
    try:
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return False
    for task in tasks:
        try:
            os.sched_setaffinity(task, set(cores))
        except OSError:  # the thread ended meanwhile
            continue
    return True


class CpuPlacement:
    """The launcher's side: measures the run's processes between versions and pins them by the plan."""

    def __init__(self, log: Any, *, yields_to_others: bool = True) -> None:
        self.cores = sorted(os.sched_getaffinity(0))
        self.log = log
        self.yields_to_others = yields_to_others
        self.plan: CorePlan | None = None
        self._last: tuple[float, float, dict[int, float]] | None = None

    def update(self, trainer: int, others: Sequence[int], helpers: Sequence[int] = ()) -> CorePlan | None:
        """After a version: plan from the use since the last one, pin every process by it. ``helpers``:
        the run's processes it leaves unpinned (the launcher, its fork server, warm spares); their use
        is the run's, not another job's, and counts with the others'."""
        now = time.monotonic()
        host = read_host_busy_seconds()
        pids = (trainer, *others, *helpers, os.getpid())
        used = {pid: s for pid in pids if (s := process_cpu_seconds(pid)) is not None}
        last, self._last = self._last, (now, host or 0.0, used)
        if last is None or host is None or trainer not in used:
            return self.plan
        wall_s = max(now - last[0], 1e-6)
        delta = {pid: used[pid] - last[2].get(pid, used[pid]) for pid in used}
        others_busy = sum(d for pid, d in delta.items() if pid != trainer) / wall_s
        outside_busy = max(0.0, (host - last[1]) - sum(delta.values())) / wall_s
        plan = plan_cores(
            self.cores, others_busy, outside_busy, current=self.plan, yields_to_others=self.yields_to_others
        )
        self._apply(plan, trainer, others)
        if plan != self.plan:
            cores = list(plan.trainer) if plan else "all"
            self.log.info("cpu placement", trainer_cores=cores, others_busy_cores=round(others_busy, 2),
                          outside_busy_cores=round(outside_busy, 2))  # fmt: skip
        self.plan = plan
        return plan

    def _apply(self, plan: CorePlan | None, trainer: int, others: Sequence[int]) -> None:
        """Pins the actors (restarted ones too: this runs every version); the launcher's own process,
        which may be a user's program, is left alone."""
        if plan is None and self.plan is None:
            return
        pin(trainer, plan.trainer if plan else self.cores)
        for pid in others:
            pin(pid, plan.others if plan else self.cores)


def places_cores(config: Config, is_local: bool) -> bool:
    """Whether ``topology.cpu_placement`` applies: not off, nothing in the configuration against it
    (psrl.config.rules.cpu_placement_blockers), every actor on this host, and the host CPU-only."""
    if config.topology.cpu_placement == "off" or not is_local or cpu_placement_blockers(config):
        return False
    return config.topology.device == "cpu" or not nvidia_gpu_present()
