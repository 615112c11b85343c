"""Elastic chaos plans: scale events are drawn in between the faults, seeded apart from them."""

from __future__ import annotations

from launch.chaos import SCALE_DOWN, SCALE_UP, mix_scale_events
from psrl.reliability.faults import plan_faults

TARGETS = ["rollout-0", "rollout-1", "router"]


def test_scale_events_go_in_between_and_leave_the_faults_as_drawn() -> None:
    faults = plan_faults(3, TARGETS, 8, mean_gap_s=4.0)
    mixed = mix_scale_events(3, faults, 0.5, 4.0)
    assert [f for f in mixed if f.kind not in (SCALE_UP, SCALE_DOWN)] == faults
    scale = [f for f in mixed if f.kind in (SCALE_UP, SCALE_DOWN)]
    assert {f.kind for f in scale} == {SCALE_UP, SCALE_DOWN} and all(f.target == "rollout" for f in scale)
    assert mix_scale_events(3, faults, 0.5, 4.0) == mixed  # the seed decides


def test_no_share_no_scale_events() -> None:
    faults = plan_faults(1, TARGETS, 3, mean_gap_s=4.0)
    assert mix_scale_events(1, faults, 0.0, 4.0) == faults
