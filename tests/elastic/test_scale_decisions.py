"""The pure decision of elastic rollout: what a scale request adds, removes or why it is refused."""

from __future__ import annotations

import pytest

from psrl.coordination.scaling import (
    NO_TARGET,
    ScaleAsk,
    ScaleSpecError,
    decide_scale,
    parse_scale_spec,
    scale_limit,
)

TWO = ["rollout-0", "rollout-1"]


@pytest.mark.parametrize(
    ("text", "ask"),
    [
        ("rollout=+2", ScaleAsk("rollout", delta=2)),
        ("rollout=-1", ScaleAsk("rollout", delta=-1)),
        ("rollout=3", ScaleAsk("rollout", target=3)),
        (" rollout=0 ", ScaleAsk("rollout", target=0)),
    ],
)
def test_a_scale_argument_is_a_change_or_a_count(text: str, ask: ScaleAsk) -> None:
    assert parse_scale_spec(text) == ask


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("rollout+2", "ROLE=+N"),
        ("rollout=two", "ROLE=+N"),
        ("trainer=+1", "'trainer' cannot be scaled"),
        ("rollout=+0", "a change of 0 changes nothing"),
    ],
)
def test_a_malformed_scale_argument_says_what_is_wanted(text: str, names: str) -> None:
    with pytest.raises(ScaleSpecError, match=names.replace("+", r"\+")):
        parse_scale_spec(text)


def test_new_instances_take_the_next_indices_never_reused_ones() -> None:
    plan = decide_scale(ScaleAsk("rollout", delta=2), TWO, limit=4, next_index=5)
    assert plan.added == ("rollout-5", "rollout-6") and plan.removed == () and not plan.is_refused


def test_removal_takes_the_newest_instances_first() -> None:
    before = ["rollout-0", "rollout-1", "rollout-10", "rollout-2"]
    plan = decide_scale(ScaleAsk("rollout", delta=-2), before, limit=8, next_index=11)
    assert plan.removed == ("rollout-2", "rollout-10") and plan.added == ()


def test_a_count_adds_or_removes_the_difference() -> None:
    assert decide_scale(ScaleAsk("rollout", target=4), TWO, 4, 2).added == ("rollout-2", "rollout-3")
    four = [f"rollout-{i}" for i in range(4)]
    assert decide_scale(ScaleAsk("rollout", target=1), four, 4, 4).removed == ("rollout-1", "rollout-2", "rollout-3")
    same = decide_scale(ScaleAsk("rollout", target=2), TWO, 4, 2)
    assert same.added == () and same.removed == () and not same.is_refused


def test_below_one_instance_is_refused_with_how_many_may_go() -> None:
    plan = decide_scale(ScaleAsk("rollout", delta=-2), TWO, 4, 2)
    assert plan.is_refused and plan.added == () and plan.removed == ()
    assert "a run needs at least one" in plan.error and "rollout=-1" in plan.error
    last = decide_scale(ScaleAsk("rollout", target=0), ["rollout-0"], 4, 1)
    assert "nothing can be removed; add one first (rollout=+1)" in last.error


def test_above_the_placements_room_is_refused_naming_the_room_and_the_fix() -> None:
    plan = decide_scale(ScaleAsk("rollout", delta=3), TWO, limit=4, next_index=2)
    assert plan.is_refused and plan.added == ()
    assert "would run 5" in plan.error and "room for 4" in plan.error and "topology.max_rollout_instances" in plan.error


def test_a_request_that_changes_nothing_or_names_another_role_is_refused() -> None:
    assert "changes nothing" in decide_scale(ScaleAsk("rollout", delta=0, target=NO_TARGET), TWO, 4, 2).error
    assert "cannot be scaled" in decide_scale(ScaleAsk("trainer", delta=1), TWO, 4, 2).error


def test_the_room_is_the_setting_else_gpus_else_cores_never_below_the_start() -> None:
    assert scale_limit(configured=6, num_gpus=2, num_cores=16, num_started=2) == 6
    assert scale_limit(configured=0, num_gpus=3, num_cores=16, num_started=2) == 3
    assert scale_limit(configured=0, num_gpus=0, num_cores=16, num_started=2) == 16
    assert scale_limit(configured=0, num_gpus=0, num_cores=2, num_started=4) == 4
