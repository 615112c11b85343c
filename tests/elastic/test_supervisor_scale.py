"""The supervisor answers `psrl.scale` over the run's real bus: an instance added as a new process, one
removed that never reports drained stopped at its drain timeout and not restarted, refusals changing
nothing (real processes with fake actors; the router's drain is tested in test_router_retire)."""

from __future__ import annotations

from pathlib import Path

import pytest

import psrl
from bus.messages import ActorRestarted, ScaleDecided, Shutdown
from psrl.scale_request import ScaleError
from tests.system.launch_helpers import Background, logged_events, make_supervisor, wait_until

pytestmark = pytest.mark.system


def test_the_supervisor_adds_retires_and_refuses_over_the_bus(tmp_path: Path) -> None:
    sup = make_supervisor(tmp_path, overrides=["topology.max_rollout_instances=3", "topology.drain_timeout_s=1"])
    run = Background(sup).start()
    try:
        run.wait_ready()
        wait_until(lambda: sup.run_dir.read_state().get("status") == "running", 30, "the run serving")
        added = psrl.scale(sup.run_dir.path, "rollout=+1", timeout_s=30)
        assert added.added == ("rollout-2",) and added.after == ("rollout-0", "rollout-1", "rollout-2")
        wait_until(lambda: "rollout-2" in sup.processes and sup.processes["rollout-2"].is_ready, 60, "rollout-2 ready")
        with pytest.raises(ScaleError, match="room for 3"):
            psrl.scale(sup.run_dir.path, "rollout=+1", timeout_s=30)
        removed = psrl.scale(sup.run_dir.path, "rollout=-1", timeout_s=30)
        assert removed.removed == ("rollout-2",)
        wait_until(lambda: "rollout-2" not in sup.processes, 30, "rollout-2 stopped at its drain timeout")
        assert sorted(sup.processes) == sorted(s.name for s in sup.specs if s.name != "rollout-2")
    finally:
        sup.end("test over")
        run.join()
    events = logged_events(sup.run_dir)
    decided = [e.message for e in events if isinstance(e.message, ScaleDecided)]
    assert [(d.added, d.removed, bool(d.error)) for d in decided] == [
        (["rollout-2"], [], False),
        ([], [], True),
        ([], ["rollout-2"], False),
    ]
    shutdowns = [e.message.targets for e in events if isinstance(e.message, Shutdown)]
    assert ["rollout-2"] in shutdowns
    assert not [e for e in events if isinstance(e.message, ActorRestarted)]
