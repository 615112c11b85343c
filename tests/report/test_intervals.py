"""Where a step's interval went: its batch's wait, the trainer's compute and the rest, from a run's timeline."""

from __future__ import annotations

import math

import pytest

from psrl.report.intervals import step_intervals, summary
from psrl.report.metrics_file import MetricsRecord
from psrl.report.timeline import BatchPoint, ProgressPoint, RunTimeline


def _timeline() -> RunTimeline:
    line = RunTimeline()
    line.progress = [ProgressPoint(t, step, step, 8, 0.0) for t, step in ((10.0, 1), (11.0, 2), (15.0, 3), (16.0, 4))]
    line.progress.append(ProgressPoint(17.0, 5, 5, 0, 0.0))  # trained nothing: no row
    # step 2's batch was ready before step 1 ended; step 3's came 2.5 s after it; step 4's has no record
    line.batches = [BatchPoint(9.0, 2, 8, 100), BatchPoint(13.5, 3, 8, 100), BatchPoint(14.0, 3, 8, 100)]
    line.metrics = [MetricsRecord(step, "trainer-0", 0, 0.0, step, {"perf/train_seconds": s})
                    for step, s in ((2, 0.8), (3, 0.9))]  # fmt: skip
    return line


def test_each_interval_splits_into_the_batch_wait_the_compute_and_the_rest() -> None:
    rows = step_intervals(_timeline())
    assert [r.step for r in rows] == [2, 3, 4]
    two, three, four = rows
    assert (two.interval_s, two.batch_wait_s, two.train_s) == (1.0, 0.0, 0.8)
    assert two.other_s == pytest.approx(0.2)
    assert (three.interval_s, three.batch_wait_s, three.train_s) == (4.0, 2.5, 0.9)  # the first batch record counts
    assert three.other_s == pytest.approx(0.6)
    assert four.batch_wait_s == 0.0 and math.isnan(four.train_s)
    text = summary(rows)
    assert "3 intervals: median 1.000 s, mean 2.000 s" in text and "waiting for batches 2.5 s" in text
    assert "training 1.7 s" in text
