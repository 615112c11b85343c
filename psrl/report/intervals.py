"""Where each step's interval went, from the event log: waiting for its batch, the trainer's compute, the rest.

An interval runs from one step's progress report (``train.progress``) to the next. Its batch was ready at its
``train.batch``: whatever came after the previous report is time the trainer waited for the rollout. The
trainer's compute is its ``perf/train_seconds``; the rest is pushes, checkpoints and publication. With pushes in
the background a step's report comes when its push lands, so a rest can be negative (the compute started before
the previous report). The mean interval over the run is its throughput; a median alone hides the long ones.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from psrl.report.series import metric_by_step
from psrl.report.timeline import RunTimeline


@dataclass(frozen=True)
class StepInterval:
    step: int
    interval_s: float  # the previous step's progress report to this one's
    batch_wait_s: float  # of it, until this step's batch was ready
    train_s: float  # the trainer's compute for the step (nan when not reported)
    other_s: float  # interval - wait - compute

    def row(self) -> str:
        return (
            f"step {self.step:4d}  interval {self.interval_s:6.2f} s  waiting for its batch {self.batch_wait_s:6.2f}"
            f"  training {self.train_s:6.2f}  other {self.other_s:6.2f}"
        )


def step_intervals(timeline: RunTimeline) -> list[StepInterval]:
    """One row per step after the first (steps that trained nothing are skipped)."""
    reports = {p.step: p.time for p in timeline.progress if p.num_samples > 0}
    ready: dict[int, float] = {}
    for batch in timeline.batches:
        ready.setdefault(batch.step, batch.time)
    compute = dict(metric_by_step(timeline.metrics, "perf/train_seconds"))
    rows = []
    for step in sorted(reports):
        previous = reports.get(step - 1)
        if previous is None:
            continue
        interval = reports[step] - previous
        wait = max(0.0, ready.get(step, previous) - previous)
        train = compute.get(step, float("nan"))
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
