"""`psrl launch demo actor.lora.rank=8 engine.lora_mode=unmerged`: the embedded instances serve the adapter
versions unmerged in a real run. Every pushed version is loaded by both instances with no failed sync, the
run trains to its last step, and every recorded decision replays."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import InstanceSyncFailed, TrainerProgress, WeightsLoaded
from tests.system.test_lora_launch import launch, replays_fully

pytestmark = [pytest.mark.system, pytest.mark.slow, pytest.mark.timeout(900)]


def test_an_unmerged_lora_run_loads_every_version_and_replays(tmp_path: Path) -> None:
    run = launch(tmp_path, "unmerged", ["trainer.total_steps=3", "engine.lora_mode=unmerged"])
    found = [e.event.message for e in EventLogReader(run / "events").events()]
    loaded = {(m.instance, m.version) for m in found if isinstance(m, WeightsLoaded)}
    assert {instance for instance, _ in loaded} == {"rollout-0", "rollout-1"} and {v for _, v in loaded} >= {1, 2}
    assert not [m for m in found if isinstance(m, InstanceSyncFailed)]
    assert [m.version for m in found if isinstance(m, TrainerProgress)] == [1, 2, 3]
    replays_fully(run)
