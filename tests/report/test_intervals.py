"""Where a step's interval went: its batch's wait, the trainer's compute and the rest, from a run's timeline."""

from __future__ import annotations

import pytest

from psrl.report.intervals import step_intervals, summary
from psrl.report.metrics_file import MetricsRecord
from psrl.report.timeline import BatchPoint, ProgressPoint, RunTimeline


def _computed(step: int, end: float, seconds: float, sender: str = "trainer-0") -> MetricsRecord:
    return MetricsRecord(step, sender, 0, end, step, {"perf/train_seconds": seconds})


def _timeline() -> RunTimeline:
    line = RunTimeline()
    # the steps' compute ended at 10, 11, 15 and 16 s; step 5 trained nothing (no compute reported)
    line.metrics = [_computed(1, 10.0, 0.7), _computed(2, 11.0, 0.8), _computed(3, 15.0, 0.9), _computed(4, 16.0, 0.5)]
    line.metrics.append(MetricsRecord(3, "coordinator", 0, 14.0, 3, {"reward/mean": 0.5}))  # not the trainer's
    line.metrics.append(_computed(2, 30.0, 9.9, sender="trainer-1"))  # a second rank: the first report counts
    # progress reports come when a step's push lands, later than its compute's end: they set no boundary
    line.progress = [ProgressPoint(t + 0.4, step, step, 8, 0.0) for t, step in ((10.0, 1), (11.0, 2), (15.0, 3))]
    # step 2's batch was ready before step 1 ended; step 3's came 2.5 s after it; step 4's has no record
    line.batches = [BatchPoint(9.0, 2, 8, 100), BatchPoint(13.5, 3, 8, 100), BatchPoint(14.0, 3, 8, 100)]
    return line


def test_each_interval_splits_into_the_batch_wait_the_compute_and_the_rest() -> None:
    rows = step_intervals(_timeline())
    assert [r.step for r in rows] == [2, 3, 4]
    two, three, four = rows
    assert (two.interval_s, two.batch_wait_s, two.train_s) == (1.0, 0.0, 0.8)
    assert two.other_s == pytest.approx(0.2)
    assert (three.interval_s, three.batch_wait_s, three.train_s) == (4.0, 2.5, 0.9)  # the first batch record counts
    assert three.other_s == pytest.approx(0.6)
    assert (four.interval_s, four.batch_wait_s, four.train_s) == (1.0, 0.0, 0.5)
    text = summary(rows)
    assert "3 intervals: median 1.000 s, mean 2.000 s" in text and "waiting for batches 2.5 s" in text
    assert "training 2.2 s" in text


def test_a_run_without_two_consecutive_computed_steps_has_no_interval() -> None:
    line = RunTimeline()
    line.metrics = [_computed(1, 10.0, 0.7), _computed(3, 12.0, 0.7)]
    assert step_intervals(line) == []
    assert summary([]) == "no consecutive steps"
