"""The colocated consume/generate cycle as pause and resume commands (pure; no GPU)."""

from __future__ import annotations

from psrl.tms import ROLLOUT, TRAINER, ColocationSwitch, SwitchCommand

INSTANCES = ("rollout-0", "rollout-1")


def make(managed=(TRAINER, ROLLOUT), trained_version=0) -> ColocationSwitch:
    return ColocationSwitch(["trainer-0"], INSTANCES, managed, trained_version=trained_version)


def actions(commands: list[SwitchCommand]) -> list[tuple[str, str]]:
    return [(c.action, c.side) for c in commands]


def test_start_pauses_the_trainer_and_rollout_keeps_the_gpus() -> None:
    switch = make()
    assert actions(switch.start(0.0)) == [("pause", TRAINER)]
    assert switch.switched("trainer-0", "pause", 0.1) == []  # rollout is resident already: nothing to resume
    assert switch.holder == ROLLOUT and not switch.is_switching


def test_full_cycle_pauses_before_it_resumes() -> None:
    switch = make()
    switch.start(0.0)
    switch.switched("trainer-0", "pause", 0.1)
    pause = switch.handed_over(0, 1.0)
    assert actions(pause) == [("pause", ROLLOUT)] and pause[0].targets == INSTANCES
    assert switch.switched("rollout-0", "pause", 1.1) == []  # one instance still holds memory
    assert switch.switched("rollout-0", "pause", 1.15) == []  # a repeated report changes nothing
    resume = switch.switched("rollout-1", "pause", 1.2)
    assert actions(resume) == [("resume", TRAINER)] and switch.holder == TRAINER
    assert actions(switch.trained_version(1, 2.0)) == [("pause", TRAINER)]
    assert actions(switch.switched("trainer-0", "pause", 2.1)) == [("resume", ROLLOUT)]
    assert [round(s.pause_wait_ms) for s in switch.completed] == [100, 200, 100]


def test_a_buffer_handed_over_during_training_keeps_the_trainer() -> None:
    switch = make()
    switch.start(0.0)
    switch.switched("trainer-0", "pause", 0.0)
    switch.handed_over(0, 1.0)
    switch.switched("rollout-0", "pause", 1.0)
    switch.switched("rollout-1", "pause", 1.0)
    assert switch.handed_over(1, 1.5) == []  # already training
    assert switch.trained_version(1, 2.0) == []  # buffer 1 waits at the trainer: it keeps the GPUs
    assert actions(switch.trained_version(2, 3.0)) == [("pause", TRAINER)]


def test_wanted_side_changing_during_a_switch_is_followed_after_it() -> None:
    switch = make()
    switch.start(0.0)
    switch.switched("trainer-0", "pause", 0.0)
    switch.handed_over(0, 1.0)  # pausing rollout
    switch.trained_version(1, 1.1)  # (cannot happen before the resume, but must not confuse the switch)
    commands = switch.switched("rollout-0", "pause", 1.2) + switch.switched("rollout-1", "pause", 1.2)
    assert actions(commands) == [("resume", TRAINER), ("pause", TRAINER)]


def test_range_train_leaves_rollout_resident() -> None:
    switch = make(managed=(TRAINER,))
    switch.start(0.0)
    switch.switched("trainer-0", "pause", 0.0)
    assert actions(switch.handed_over(0, 1.0)) == [("resume", TRAINER)]
    assert actions(switch.trained_version(1, 2.0)) == [("pause", TRAINER)]
    assert switch.switched("trainer-0", "pause", 2.1) == []  # rollout was never paused


def test_an_exited_instance_is_not_waited_for_and_a_restarted_one_is_paused() -> None:
    switch = make()
    switch.start(0.0)
    switch.switched("trainer-0", "pause", 0.0)
    switch.handed_over(0, 1.0)
    switch.switched("rollout-0", "pause", 1.0)
    assert actions(switch.exited("rollout-1", 1.1)) == [("resume", TRAINER)]
    rejoined = switch.rejoined("rollout-1", ROLLOUT, 1.5)
    assert actions(rejoined) == [("pause", ROLLOUT)] and rejoined[0].targets == ("rollout-1",)
    assert switch.members[ROLLOUT] == ["rollout-0", "rollout-1"]


def test_unanswered_pause_is_sent_again_to_the_silent_actors() -> None:
    switch = make()
    switch.start(0.0)
    switch.switched("trainer-0", "pause", 0.0)
    switch.handed_over(0, 10.0)
    switch.switched("rollout-0", "pause", 10.5)
    assert switch.retry(12.0) == []
    again = switch.retry(15.5)
    assert actions(again) == [("pause", ROLLOUT)] and again[0].targets == ("rollout-1",)


def test_resumed_run_starts_from_its_trained_version() -> None:
    switch = make(trained_version=3)
    switch.start(0.0)
    switch.switched("trainer-0", "pause", 0.0)
    assert switch.handed_over(2, 1.0) == []  # an old buffer: already trained
    assert actions(switch.handed_over(3, 1.0)) == [("pause", ROLLOUT)]


def test_the_first_pause_is_sent_again_soon_since_the_actors_may_not_listen_yet() -> None:
    switch = make()
    assert actions(switch.start(0.0)) == [("pause", TRAINER)]
    assert switch.retry(0.2) == []
    assert actions(switch.retry(0.6)) == [("pause", TRAINER)]
    switch.switched("trainer-0", "pause", 0.7)
    switch.handed_over(0, 1.0)
    switch.switched("rollout-0", "pause", 1.1)
    assert switch.retry(2.0) == []  # later switches wait the full interval
