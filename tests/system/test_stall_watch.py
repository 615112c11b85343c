"""A run stalled on purpose: the launcher says who holds the work and what it waits for, restarts them
once, then ends the run with a resumable checkpoint.

The instances' weight pullers lack the run's CURVE keys (``tests.fakes.stalling``), so every pull is
refused at the handshake: the run trains ``staleness + 1`` steps and then waits for instances that never
load a version. Each failed attempt reaches the console as it happens, with the refusal's reason. The
restarted instances cannot reach the shards either: they fail at start (a replacement asks the shards
for their committed version first) until the restart policy or the second diagnosis ends the run.
"""

from __future__ import annotations

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import ActorRestarted, PullRetrying, StallDiagnosed, TrainerProgress
from launch.supervisor import EXIT_FAILED, Supervisor
from psrl.config import load_config
from psrl.rundir import RunDir
from psrl.trainer.checkpoint import latest_checkpoint, read_trainer_state

pytestmark = pytest.mark.system

STALLING = "tests.fakes.stalling:RolloutWithoutPullKeys"
STALENESS = 2


def test_a_stalled_run_is_diagnosed_restarted_once_and_ended_resumably(tmp_path) -> None:
    config = load_config(
        "demo",
        [
            "bus.curve=on",
            f"psrl.staleness={STALENESS}",
            "trainer.total_steps=20",
            "psrl.ps.pull_timeout_s=1",
            "psrl.ps.pull_attempts=2",
            "run.stall_timeout_s=12",
            "topology.warm_spares=0",
            "bus.handshake_timeout_s=120",
        ],
    )
    options = {f"rollout-{i}": {"actor_class": STALLING} for i in range(config.topology.n_rollout_instances)}
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "stall"), actor_options=options)
    assert sup.run() == EXIT_FAILED
    reason = sup.end_reason or ""
    stalled = reason.startswith("stalled: no training step") and "--name stall" in reason
    assert stalled or reason.startswith("rollout-"), reason

    events = [e.event.message for e in EventLogReader(sup.run_dir.events).events()]
    trained = max(m.version for m in events if isinstance(m, TrainerProgress))
    assert trained == STALENESS + 1, "the run stalls where the instances must first sync"
    # failed pulls are published as they happen (an instance may not have pulled yet when the watch looks)
    retries = [m.reason for m in events if isinstance(m, PullRetrying)]
    assert all("refused the handshake" in r or "no reply" in r for r in retries), retries
    diagnoses = [m for m in events if isinstance(m, StallDiagnosed)]
    assert [d.action for d in diagnoses] in (["restart"], ["restart", "end"])
    for diagnosis in diagnoses[:1]:  # after the restart the replacements' state decides who holds the work
        assert set(diagnosis.holders) <= {"rollout-0", "rollout-1"} and diagnosis.holders
        failing = "pulls from the parameter server keep failing" in diagnosis.waits_for
        assert failing or diagnosis.waits_for.startswith("a sync: requests need version >= 1"), diagnosis
        assert diagnosis.facts["trained_version"] == str(trained)
        for holder in diagnosis.holders:  # where it waited, written before it was restarted
            assert "(most recent call first)" in sup.run_dir.log_file(holder).read_text(errors="replace")
    restarted = {m.actor for m in events if isinstance(m, ActorRestarted)}
    assert set(diagnoses[0].holders) <= restarted <= {"rollout-0", "rollout-1"}, "the holders, nobody else"

    checkpoint = latest_checkpoint(sup.run_dir.checkpoints)
    assert checkpoint is not None and int(read_trainer_state(checkpoint)["version"]) == trained
