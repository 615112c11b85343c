"""The launcher's console follows the instance set: a scale decision is one line, and an instance that
left the set drops out of the busy column."""

from __future__ import annotations

from bus.messages import InstanceStatus, ScaleDecided, TrainerProgress
from launch.progress import ProgressView
from psrl.config import load_config
from tests.unit.launch.test_progress import event


def test_a_scale_decision_is_shown_and_a_retired_instance_leaves_the_busy_column() -> None:
    lines: list[str] = []
    view = ProgressView(load_config("demo", ["trainer.total_steps=4"]), echo=lines.append)
    for name in ("rollout-0", "rollout-1"):
        view.on_event(event(InstanceStatus(name, 0, 1, 0, 10, 100), f"{name}-router.link", 0.0))
    removed = ScaleDecided(token="t", role="rollout", delta=-1, target=-1, before=["rollout-0", "rollout-1"],
                           limit=4, next_index=2, removed=["rollout-1"], reason="psrl scale")  # fmt: skip
    refused = ScaleDecided(token="u", role="rollout", delta=-1, target=-1, before=["rollout-0"], limit=4,
                           next_index=2, error="a run needs at least one")  # fmt: skip
    view.on_event(event(removed, "supervisor"))
    view.on_event(event(refused, "supervisor"))
    view.on_event(event(TrainerProgress(1, 1, 8), "trainer-0", 1.0))
    assert lines[0] == "rollout instances 2 -> 1: -rollout-1 (psrl scale)"
    step = lines[-1]
    assert "rollout-0:" in step and "rollout-1" not in step
