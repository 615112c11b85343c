"""When failing reward calls stop a run (psrl.rewards.failures) and how the console shows them."""

from __future__ import annotations

from launch.progress import failure_counts, failure_warnings
from psrl.rewards.failures import FailureWatch, StepFailures, step_failures, stop_reason


def steps(*failed_of: tuple[int, int]) -> list[StepFailures]:
    return [StepFailures(failed, 0, calls) for failed, calls in failed_of]


def test_patience_steps_in_a_row_over_the_fraction_stop_the_run() -> None:
    watch = FailureWatch(max_fraction=0.5, patience=3)
    verdicts = [watch.observe(s) for s in steps((9, 10), (10, 10), (6, 10), (10, 10))]
    assert verdicts == [False, False, True, True]


def test_a_step_at_or_under_the_fraction_breaks_the_streak() -> None:
    watch = FailureWatch(max_fraction=0.5, patience=2)
    assert [watch.observe(s) for s in steps((10, 10), (5, 10), (10, 10), (0, 10))] == [False, False, False, False]


def test_a_step_without_reward_calls_neither_extends_nor_breaks_the_streak() -> None:
    watch = FailureWatch(max_fraction=0.5, patience=2)
    assert [watch.observe(s) for s in steps((10, 10), (0, 0), (10, 10))] == [False, False, True]


def test_a_fraction_of_one_never_stops() -> None:
    watch = FailureWatch(max_fraction=1.0, patience=1)
    assert not any(watch.observe(s) for s in steps((10, 10), (10, 10)))


def test_the_counts_come_from_the_step_metrics_and_the_stop_says_what_to_do() -> None:
    values = {"reward/num_errors": 3.0, "reward/num_timeouts": 1.0, "reward/num_scored": 4.0}
    step = step_failures(values)
    assert (step.num_failed, step.num_calls, step.fraction) == (4, 8, 0.5)
    watch = FailureWatch(0.25, 1)
    assert watch.observe(step)
    reason = stop_reason(watch, step, "ValueError: boom")
    assert "4 of 8" in reason and "ValueError: boom" in reason and "reward.error_patience" in reason


def test_the_console_shows_counts_and_first_errors() -> None:
    values = {"reward/num_errors": 2.0, "reward/num_scored": 6.0, "session/num_failed": 1.0}
    notes = {"reward/first_error": "ValueError: boom", "session/first_error": "KeyError: 'x'"}
    assert failure_counts(values) == " | reward failed 2/8 | 1 session failed"
    reward, session = failure_warnings(7, values, notes)
    assert reward.startswith("warning: step 7: 2 of 8 reward calls failed") and reward.endswith("ValueError: boom")
    assert "1 sessions (environment or agent) failed" in session and "KeyError: 'x'" in session
    assert failure_counts({"reward/num_scored": 8.0}) == "" and failure_warnings(1, {}, {}) == []
