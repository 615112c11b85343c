"""The summary figures of the scripted run, worked out by hand in tests/report/scenario.py."""

import pytest

from psrl.report.collect import PlotTimelineBuilder
from psrl.report.summary import RunSummary, summarize, work_window
from psrl.report.timeline import RunTimeline
from tests.report.events import T0_NS
from tests.report.scenario import scenario_events

T0 = T0_NS / 1e9


def scripted_timeline(reverse: bool = False) -> RunTimeline:
    builder = PlotTimelineBuilder()
    events = scenario_events()
    for event in reversed(events) if reverse else events:
        builder.observe(event)
    return builder.finish()


def test_timeline_collects_every_kind() -> None:
    line = scripted_timeline()
    assert line.start == T0 and line.first_dispatch == T0 + 1.0
    assert line.instances == ["rollout-0", "rollout-1"]
    assert len(line.status["rollout-0"]) == 17
    assert [p.step for p in line.progress] == [1, 2, 3, 4, 5]
    assert len(line.syncs) == 4 and len(line.loaded) == 8 and len(line.published) == 5
    assert line.migrations[0].num_requests == 3 and line.migrations[0].target == "rollout-1"
    assert line.run_end is not None and line.run_end.reason == "4 training steps done"


def test_order_of_arrival_does_not_matter() -> None:
    assert summarize(scripted_timeline(reverse=True)) == summarize(scripted_timeline())


def test_summary_figures() -> None:
    summary = summarize(scripted_timeline())
    assert work_window(scripted_timeline()) == (T0 + 1.0, T0 + 9.0)
    assert summary.num_steps == 4 and summary.num_steps_after_end == 1
    assert summary.work_s == pytest.approx(8.0)
    assert (summary.reward_first, summary.reward_last) == pytest.approx((0.1, 0.4))
    assert (summary.acc_first, summary.acc_last) == pytest.approx((0.05, 0.2))
    assert summary.trajectories_per_s == pytest.approx(4.0)
    assert summary.tokens_per_s == pytest.approx(50.0)
    assert summary.busy_by_instance == pytest.approx({"rollout-0": 0.5, "rollout-1": 1.0})
    assert summary.busy_fraction == pytest.approx(0.75)
    assert summary.trainer_idle_fraction == pytest.approx(0.25)
    assert summary.staleness_mean == pytest.approx(1.4)
    assert (summary.num_syncs, summary.num_migrations) == (4, 1)
    assert summary.push_ms_mean == pytest.approx(500.0)
    assert summary.load_ms_mean == pytest.approx(15.0)


def test_rows_name_every_figure() -> None:
    rows = dict(summarize(scripted_timeline()).rows())
    assert rows["training steps"].startswith("4 (+1 finished while shutting down")
    assert rows["trainer idle fraction"] == "25.0%"
    assert rows["instance busy fraction (each)"] == "rollout-0 50.0%, rollout-1 100.0%"


def test_empty_timeline_has_no_figures() -> None:
    summary = summarize(RunTimeline().finish())
    assert isinstance(summary, RunSummary)
    assert summary.num_steps == 0 and summary.trajectories_per_s is None and summary.trainer_idle_fraction is None
    assert summary.busy_fraction is None and summary.reward_first is None
    assert all(value for _, value in summary.rows())
