"""How long a stopping stage may take: trainers that save, or may still be inside a step, get longer."""

from __future__ import annotations

from launch.stopping import STEP_FINISH_FACTOR, STEP_FINISH_MIN_S, StoppingActor, grace_end

ASKED, DEADLINE, SAVE_TIMEOUT_S, LIMIT_S = 100.0, 106.0, 120.0, 2.0


def end(*actors: StoppingActor) -> float:
    return grace_end(actors, DEADLINE, ASKED, SAVE_TIMEOUT_S, LIMIT_S)


def test_actors_that_never_trained_get_the_shared_grace() -> None:
    assert end(StoppingActor(None, None, 0.1), StoppingActor(None, None, 0.3)) == DEADLINE


def test_a_trainer_saving_its_checkpoint_gets_the_save_timeout_from_when_it_said_so() -> None:
    assert end(StoppingActor(saving_since=103.0, last_step_s=0.5, silent_s=0.1)) == 103.0 + SAVE_TIMEOUT_S


def test_a_trainer_that_may_be_in_a_step_gets_several_steps_bounded_by_the_save_timeout() -> None:
    short_steps = StoppingActor(None, last_step_s=0.4, silent_s=0.2)
    assert end(short_steps) == ASKED + STEP_FINISH_MIN_S
    long_steps = StoppingActor(None, last_step_s=20.0, silent_s=0.2)
    assert end(long_steps) == ASKED + STEP_FINISH_FACTOR * 20.0
    huge_steps = StoppingActor(None, last_step_s=100.0, silent_s=0.2)
    assert end(huge_steps) == ASKED + SAVE_TIMEOUT_S


def test_a_silent_trainer_gets_no_extension() -> None:
    """Heartbeats pause for seconds on a loaded machine, so only a long silence (hung, stopped) counts."""
    assert end(StoppingActor(None, last_step_s=0.4, silent_s=3.0)) == ASKED + STEP_FINISH_MIN_S
    assert end(StoppingActor(None, last_step_s=0.4, silent_s=30.0)) == DEADLINE


def test_the_latest_end_of_the_stage_wins() -> None:
    stage = (StoppingActor(None, None, 0.1), StoppingActor(150.0, 1.0, 0.1), StoppingActor(None, 1.0, 0.1))
    assert end(*stage) == 150.0 + SAVE_TIMEOUT_S
