"""A run over CURVE trains past its first syncs: every weight pull authenticates with the run's keys.

Before the pullers took the run's keys, each instance's first pull found no server willing to talk
to it (the shards refuse a client without keys during the handshake), so the run trained
``staleness + 1`` steps and then waited for instances that never loaded a version. A trainer rank
that replaces a dead one asks the shards for their committed version the same way.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import ActorRestarted, TrainerProgress, WeightsLoaded
from launch.supervisor import EXIT_OK, Supervisor
from psrl.config import load_config
from psrl.rundir import RunDir

pytestmark = pytest.mark.system

STALENESS = 2
STEPS = STALENESS + 4


def _kill_trainer_after(version: int, sup: Supervisor, killed: dict[str, int]) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not sup.is_stopping:
        events = [e.event for e in EventLogReader(sup.run_dir.events).events()]
        trained = [e.message.version for e in events if isinstance(e.message, TrainerProgress)]
        proc = sup.processes.get("trainer-0")
        if trained and max(trained) >= version and proc is not None and proc.is_ready:
            killed["incarnation"] = proc.incarnation
            os.kill(proc.pid, signal.SIGKILL)
            return
        time.sleep(0.3)


def test_a_curve_run_syncs_every_instance_and_a_replacement_trainer_pulls(tmp_path, monkeypatch) -> None:
    scratch = tmp_path / "tmp"  # the actors' temp directory: their private copies of the keys go there
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    config = load_config(
        "demo",
        ["bus.curve=on", f"psrl.staleness={STALENESS}", f"trainer.total_steps={STEPS}", "bus.handshake_timeout_s=120"],
    )
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "curve"))
    killed: dict[str, int] = {}
    threading.Thread(target=_kill_trainer_after, args=(2, sup, killed), daemon=True).start()
    code = sup.run()
    assert code == EXIT_OK, sup.end_reason
    assert (sup.run_dir.keys / "server.key_secret").exists(), "the run was not over CURVE"

    events = [e.event for e in EventLogReader(sup.run_dir.events).events()]
    trained = [e.message.version for e in events if isinstance(e.message, TrainerProgress)]
    assert max(trained) == STEPS
    loads: dict[str, list[int]] = {}
    for event in events:
        if isinstance(event.message, WeightsLoaded):
            loads.setdefault(event.message.instance, []).append(event.message.version)
    names = [f"rollout-{i}" for i in range(config.topology.n_rollout_instances)]
    assert sorted(loads) == names, loads
    assert all(max(versions) > STALENESS + 1 for versions in loads.values()), loads
    restarts = [e.message for e in events if isinstance(e.message, ActorRestarted)]
    assert [(r.actor, r.old_incarnation) for r in restarts] == [("trainer-0", killed["incarnation"])]
    assert not list(scratch.glob("psrl-keys-*")), "an actor left its copy of the secret keys behind"
