import math

import pytest

from psrl.report.metrics_file import MetricsRecord
from psrl.report.series import (
    binned_mean,
    busy_fraction,
    busy_series,
    metric_by_step,
    metric_source,
    nice_bin_seconds,
    ps_versions,
    staleness_histogram,
    status_segments,
    sync_phases,
    trainer_busy_by_step,
    version_at,
    version_lag,
)
from psrl.report.timeline import LoadedPoint, ProgressPoint, StatusSample


def record(sender: str, step: int, version: int | None = None, **values: float) -> MetricsRecord:
    return MetricsRecord(step, sender, 0, float(step), version, {k.replace("__", "/"): v for k, v in values.items()})


def sample(time: float, running: int, version: int = 0) -> StatusSample:
    return StatusSample(time, running, 0, version, 0.0, 0.0)


def test_coordinator_is_preferred_then_the_first_trainer_rank() -> None:
    records = [record("trainer-1", 1, x=1.0), record("trainer-0", 1, x=2.0), record("router", 1, x=3.0)]
    assert metric_source(records, "x") == "trainer-0"
    assert metric_source([*records, record("coordinator", 1, x=4.0)], "x") == "coordinator"
    assert metric_source([record("router", 1, x=3.0)], "x") == "router"
    assert metric_source(records, "missing") is None


def test_repeated_steps_are_averaged_and_sorted() -> None:
    records = [record("coordinator", 2, x=1.0), record("coordinator", 1, x=5.0), record("coordinator", 2, x=3.0)]
    assert metric_by_step(records, "x") == [(1, 5.0), (2, 2.0)]


def test_staleness_from_router_counts_else_one_trainer_rank() -> None:
    router = [record("router", 0, staleness__count_0=4.0), record("router", 1, staleness__count_1=3.0),
              record("router", 2, staleness__count_1=1.0)]  # fmt: skip
    assert staleness_histogram(router) == {0: 4.0, 1: 4.0}
    trainers = [record(f"trainer-{rank}", 1, **{"staleness/hist/2": 5.0}) for rank in (0, 1)]
    assert staleness_histogram(trainers) == {2: 5.0}
    assert staleness_histogram([record("router", 0, staleness__count_0=math.nan)]) == {}


def test_each_report_holds_until_the_next_but_silence_is_not_busy() -> None:
    samples = [sample(0.0, 1), sample(1.0, 1), sample(2.0, 0), sample(20.0, 1)]
    segments = [(a, b) for a, b, _ in status_segments(samples, end=30.0)]
    assert segments == [(0.0, 1.0), (1.0, 2.0), (2.0, 7.0), (20.0, 21.0)]
    assert busy_fraction(samples, 0.0, 30.0) == pytest.approx(3.0 / 30.0)
    assert busy_fraction([], 0.0, 1.0) is None
    assert busy_fraction(samples, 5.0, 5.0) is None


def test_binned_busy_and_mean_running() -> None:
    samples = [sample(t * 0.5, 2 if t < 4 else 0) for t in range(9)]  # busy for [0, 2), idle for [2, 4)
    assert busy_series(samples, 0.0, 4.0, 1.0) == [(0.0, 1.0), (1.0, 1.0), (2.0, 0.0), (3.0, 0.0)]
    assert busy_series(samples, 0.0, 4.0, 1.5) == [(0.0, 1.0), (1.5, pytest.approx(1 / 3)), (3.0, 0.0)]
    running = binned_mean(samples, 1.0, 3.0, 2.0, lambda s: float(s.num_running))
    assert running == [(1.0, pytest.approx(1.0))]
    with pytest.raises(ValueError, match="positive"):
        busy_series(samples, 0.0, 1.0, 0.0)


def test_nice_bins() -> None:
    assert nice_bin_seconds(10.0) == 0.25
    assert nice_bin_seconds(100.0) == 2.0
    assert nice_bin_seconds(3600.0) == 60.0
    assert nice_bin_seconds(10**7) == 3600.0


def test_versions_and_lag() -> None:
    changes = ps_versions([(5.0, 2), (3.0, 1), (4.0, 1), (6.0, 1)], start=0.0, initial=0)
    assert changes == [(0.0, 0), (3.0, 1), (5.0, 2)]
    assert version_at(changes, 4.9) == 1 and version_at(changes, 5.0) == 2 and version_at(changes, -1.0) is None
    assert ps_versions([(3.0, 1)], start=0.0, initial=None) == [(3.0, 1)]
    lags = version_lag([sample(2.0, 0, 0), sample(3.5, 0, 0), sample(5.5, 0, 1), sample(6.0, 0, 3)], changes)
    assert lags == [(2.0, 0), (3.5, 1), (5.5, 1), (6.0, 0)]


def test_sync_phases_take_the_slowest_rank_and_every_load() -> None:
    push = {"sync/push_s": 0.5, "sync/serialize_s": 0.1, "sync/transfer_s": 0.2, "sync/commit_s": 0.1}
    slower = dict(push, **{"sync/transfer_s": 0.3})
    records = [MetricsRecord(1, "trainer-0", 0, 0.0, 7, push), MetricsRecord(1, "trainer-1", 0, 0.0, 7, slower)]
    loads = [LoadedPoint(1.0, "rollout-0", 7, 10.0), LoadedPoint(1.0, "rollout-1", 7, 30.0),
             LoadedPoint(2.0, "rollout-0", 8, 5.0)]  # fmt: skip
    first, second = sync_phases(records, loads)
    assert first.version == 7
    assert (first.serialize_ms, first.transfer_ms, first.commit_ms) == pytest.approx((100.0, 300.0, 100.0))
    assert first.other_push_ms == 0.0 and first.push_ms == pytest.approx(500.0)
    assert (first.load_ms_max, first.load_ms_mean, first.num_loads) == (30.0, 20.0, 2)
    assert second.version == 8 and second.push_ms == 0.0 and second.num_loads == 1


def test_trainer_busy_uses_compute_and_push_else_step_time() -> None:
    records = [
        record("trainer-0", 1, perf__train_seconds=1.0),
        record("trainer-0", 1, sync__push_s=0.25),
        record("trainer-1", 1, perf__train_seconds=1.5),
        record("coordinator", 1, perf__train_seconds=9.0),
    ]
    assert trainer_busy_by_step(records, []) == {1: 1.5}
    progress = [ProgressPoint(1.0, 1, 1, 8, 2.0), ProgressPoint(2.0, 2, 2, 8, 3.0)]
    assert trainer_busy_by_step([], progress) == {1: 2.0, 2: 3.0}
    background = [  # a push in the background held the trainer only while it waited for the one before
        record("trainer-0", 2, perf__train_seconds=1.0),
        record("trainer-0", 2, sync__push_s=0.4, sync__push_wait_s=0.05),
    ]
    assert trainer_busy_by_step(background, []) == {2: pytest.approx(1.05)}
