"""The report shows failed reward calls, sessions and generations, and a reward line that is not hidden."""

from __future__ import annotations

from psrl.report.metrics_file import MetricsRecord
from psrl.report.plots_training import reward_lines
from psrl.report.summary import summarize
from psrl.report.timeline import RunTimeline


def record(step: int, values: dict[str, float], notes: dict[str, str] | None = None) -> MetricsRecord:
    return MetricsRecord(step, "coordinator", 0, 1.0 + step, step, values, notes or {})


def test_the_summary_counts_reward_errors_and_timeouts_and_names_the_first() -> None:
    timeline = RunTimeline(start=0.0, end=10.0, num_events=3)
    timeline.metrics = [
        record(1, {"reward/num_scored": 6.0, "reward/num_errors": 2.0, "session/num_failed": 1.0},
               {"reward/first_error": "ValueError: boom"}),
        record(2, {"reward/num_scored": 7.0, "reward/num_timeouts": 1.0, "generation/num_failed": 0.0},
               {"reward/first_error": "no result within 10.0 s"}),
    ]  # fmt: skip
    rows = dict(summarize(timeline).rows())
    assert rows["reward calls raised / timed out (of all calls)"] == "2 / 1 (of 16)"
    assert rows["sessions / generations failed"] == "1 / 0"
    assert rows["first failed reward call"] == "ValueError: boom"


def test_a_reward_equal_to_the_accuracy_is_one_line_named_for_both() -> None:
    # regression: a 0/1 reward drew the accuracy exactly over the reward, and the legend named both
    same = [(1, 0.25), (2, 0.5)]
    (line,) = reward_lines(same, list(same))
    assert "reward" in line[3] and "accuracy" in line[3]
    reward, accuracy = reward_lines(same, [(1, 0.5), (2, 0.5)])
    assert reward[2] == "-" and accuracy[2] == "--"  # where they meet, the dashed accuracy leaves the reward visible
    assert reward_lines(same, []) == [(same, "o", "-", "reward (mean over the step's trajectories)")]
