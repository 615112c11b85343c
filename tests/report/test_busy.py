"""The step line's busy figure: time-weighted from status reports (psrl.report.busy)."""

from __future__ import annotations

import pytest

from psrl.report.busy import BusyClock


def test_busy_is_the_share_of_time_not_of_reports() -> None:
    # regression: an instance reports nothing while its engine decodes, then sends the reports it owes
    # in a burst, all idle; counting reports read 1 busy in 6 (17%) for an instance busy 80% of the time
    clock = BusyClock()
    clock.report("rollout-0", 0.0, num_running=64, is_paused=False)
    for at in (0.80, 0.81, 0.82, 0.83, 0.84, 1.0):
        clock.report("rollout-0", at, num_running=0, is_paused=False)
    spent = clock.take()["rollout-0"]
    assert spent.busy == pytest.approx(0.8)
    assert (spent.generating, spent.idle) == pytest.approx((0.8, 0.2))


def test_syncing_is_not_idle_and_states_carry_into_the_next_step() -> None:
    clock = BusyClock()
    clock.report("rollout-1", 0.0, num_running=0, is_paused=True)
    clock.report("rollout-1", 0.5, num_running=3, is_paused=False)
    assert clock.take()["rollout-1"].syncing == pytest.approx(0.5)
    clock.report("rollout-1", 1.5, num_running=0, is_paused=False)
    assert clock.take()["rollout-1"].busy == pytest.approx(1.0)  # generating since the report at 0.5
    assert clock.take()["rollout-1"].total == 0.0
