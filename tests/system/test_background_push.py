"""`psrl launch` with every version pushed from a snapshot on the trainer's push thread
(`trainer.background_push=true`, auto-off on the CPU): each version is published, loaded and reported in
order, the step reports how long it waited for the previous push, and every recorded decision replays."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import Metrics, TrainerProgress, WeightsPublished, WeightsPushed

from .test_rollout_correction import launch, replays_fully

pytestmark = pytest.mark.system


def test_versions_pushed_in_the_background_are_published_reported_and_replayed_in_order(tmp_path: Path) -> None:
    run = launch(tmp_path, "background-push", ["trainer.background_push=true", "trainer.save_freq=2"])
    replays_fully(run)
    events = [e.event for e in EventLogReader(run / "events").events()]
    pushed = [e.message.version for e in events if isinstance(e.message, WeightsPushed)]
    published = [e.message.version for e in events if isinstance(e.message, WeightsPublished)]
    progress = [e.message.version for e in events if isinstance(e.message, TrainerProgress)]
    assert pushed == published == progress == [1, 2, 3, 4]
    waits = [e.message.values["sync/push_wait_s"] for e in events
             if isinstance(e.message, Metrics) and "sync/push_wait_s" in e.message.values]  # fmt: skip
    assert len(waits) == 4 and all(w >= 0 for w in waits)
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == "step_00000004"
