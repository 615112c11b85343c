"""The launcher's console lines from a run's events (launch.progress)."""

from __future__ import annotations

from typing import Any

from bus.messages import InstanceStatus, Metrics, TrainerProgress
from bus.schema import Envelope, Event
from launch.progress import ProgressView
from psrl.config import load_config


def event(message: Any, sender: str, at_s: float = 0.0) -> Event[Any]:
    ns = int(at_s * 1e9)
    return Event(Envelope(message.KIND, 1, sender, 0, 1, ns, 1_700_000_000_000_000_000 + ns), message)


def test_a_step_with_failed_rewards_warns_and_busy_is_the_share_of_time() -> None:
    lines: list[str] = []
    view = ProgressView(load_config("demo", ["trainer.total_steps=4"]), echo=lines.append)
    for at_s, running in ((0.0, 64), (0.8, 0), (0.81, 0), (0.82, 0), (1.0, 0)):
        status = InstanceStatus("rollout-0", 0, running, 0, 10, 100)
        view.on_event(event(status, "rollout-0-router.link", at_s))
    values = {"reward/mean": 0.0, "reward/num_errors": 2.0, "reward/num_scored": 6.0, "session/num_failed": 0.0}
    view.on_event(event(Metrics(1, values, {"reward/first_error": "ValueError: boom"}), "coordinator"))
    view.on_event(event(TrainerProgress(1, 1, 8), "trainer-0"))
    warning, legend, step = lines
    assert warning.startswith("warning: step 1: 2 of 8 reward calls failed") and "ValueError: boom" in warning
    assert legend.startswith("(busy: ")
    assert "| reward failed 2/8 |" in step and "busy rollout-0:80%" in step
    assert "reward calls failed: 2 of 8" in "\n".join(view.summary_lines())
