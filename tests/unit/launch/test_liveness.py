"""The supervisor's liveness rule: one silent actor is dead, a machine-wide pause is not."""

from __future__ import annotations

from launch.liveness import Liveness

RULE = Liveness(limit_s=2.0, stall_factor=4.0)


def test_one_silent_actor_among_live_ones_is_dead_after_the_limit() -> None:
    silences = {"trainer-0": 2.1, "router": 0.2, "coordinator": 0.1, "ps-0": 0.3}
    assert not RULE.is_machine_stall(silences)
    assert RULE.dead(silences) == ["trainer-0"]
    assert RULE.dead({**silences, "trainer-0": 1.9}) == []


def test_most_actors_late_together_is_a_stall_of_the_machine_with_a_longer_limit() -> None:
    silences = {"router": 2.4, "coordinator": 2.3, "ps-0": 1.5, "ps-1": 1.2, "trainer-0": 0.2}
    assert RULE.is_machine_stall(silences)
    assert RULE.dead(silences) == []
    assert RULE.dead({**silences, "router": 8.5}) == ["router"]  # past stall_factor x limit: dead after all


def test_a_late_watcher_cannot_tell_a_silent_actor_from_its_own_pause() -> None:
    silences = {"router": 2.5, "coordinator": 0.1, "ps-0": 0.1}
    assert RULE.dead(silences, watcher_gap_s=0.05) == ["router"]
    assert RULE.dead(silences, watcher_gap_s=2.4) == []


def test_two_actors_are_not_a_crowd_when_many_more_are_on_time() -> None:
    silences = {"a": 2.2, "b": 2.2, **{f"ok{i}": 0.1 for i in range(4)}}
    assert sorted(RULE.dead(silences)) == ["a", "b"]
