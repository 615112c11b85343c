"""The order in which the fork server imports actor classes (each class's actors are forked once it is imported)."""

from __future__ import annotations

from launch.forkserver import AHEAD_CLASSES, import_order


def test_the_trainer_is_imported_first_and_unknown_classes_last() -> None:
    assert AHEAD_CLASSES[0] == "trainer"  # the first step waits for the trainer's model, so it starts first
    assert import_order(["coordinator", "custom", "rollout", "trainer", "ps"]) == [
        "trainer", "rollout", "ps", "coordinator", "custom"
    ]  # fmt: skip
    assert import_order(["b_extra", "a_extra"]) == ["b_extra", "a_extra"]  # others keep the plan's order
