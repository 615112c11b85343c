"""Where each step's interval went, from the event log: waiting for its batch, the trainer's compute, the rest.

An interval runs from the end of one step's compute to the end of the next one's: the trainer's metrics of a
step (``perf/train_seconds``) go out as its compute ends, before its push lands, so a push in the background
does not move the boundary, and a checkpoint written after the last step is in no interval (as a step clock
that stops at the optimizer's last update). Its batch was ready at its ``train.batch``: whatever came after the
previous step's end is time the trainer waited for the rollout. The rest is what held the trainer otherwise
(a push it waited for, a checkpoint's copy). The mean interval over the run is its throughput; a median alone
hides the long ones.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from psrl.report.timeline import RunTimeline


@dataclass(frozen=True)
class StepInterval:
    step: int
    interval_s: float  # the end of the previous step's compute to the end of this one's
    batch_wait_s: float  # of it, until this step's batch was ready
    train_s: float  # the trainer's compute for the step
    other_s: float  # interval - wait - compute

    def row(self) -> str:
        return (
            f"step {self.step:4d}  interval {self.interval_s:6.2f} s  waiting for its batch {self.batch_wait_s:6.2f}"
            f"  training {self.train_s:6.2f}  other {self.other_s:6.2f}"
        )


def step_intervals(timeline: RunTimeline) -> list[StepInterval]:
    """One row per step after the first (steps that trained nothing report no compute and are skipped)."""
    ends: dict[int, float] = {}
    compute: dict[int, float] = {}
    for record in timeline.metrics:
        if "perf/train_seconds" in record.values and record.step not in ends:
            ends[record.step] = record.wall_time
            compute[record.step] = record.values["perf/train_seconds"]
    ready: dict[int, float] = {}
    for batch in timeline.batches:
        ready.setdefault(batch.step, batch.time)
    rows = []
    for step in sorted(ends):
        previous = ends.get(step - 1)
        if previous is None:
            continue
        interval = ends[step] - previous
        wait = max(0.0, ready.get(step, previous) - previous)
        train = compute[step]
        rows.append(StepInterval(step, interval, wait, train, interval - wait - train))
    return rows


def summary(rows: list[StepInterval]) -> str:
    """Median and mean interval, and the totals of waiting and training."""
    if not rows:
        return "no consecutive steps"
    intervals = [r.interval_s for r in rows]
    trained = sum(r.train_s for r in rows if math.isfinite(r.train_s))
    median, mean = statistics.median(intervals), statistics.fmean(intervals)
    return (
        f"{len(rows)} intervals: median {median:.3f} s, mean {mean:.3f} s; "
        f"of {sum(intervals):.1f} s, waiting for batches {sum(r.batch_wait_s for r in rows):.1f} s, "
        f"training {trained:.1f} s"
    )
