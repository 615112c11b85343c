"""Elastic rollout in a real `psrl launch demo` run: 2 -> 4 instances (`psrl scale`), one of them lost for
good (``topology.restart_rollout=false``), then down to 1 (`psrl.scale`); bad requests are refused without
changing anything; the run finishes, nothing is lost or duplicated and every decision replays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import psrl
from bus.eventlog.reader import EventLogReader
from bus.messages import (
    ActorExited,
    ActorRestarted,
    ActorStarted,
    GenerateResult,
    InstanceDrained,
    InstanceStatus,
    Ready,
    RoutingRecord,
    ScaleDecided,
    TrainerProgress,
)
from psrl.config import load_config
from psrl.reliability.invariants import check_invariants
from psrl.replay.runner import replay_run
from psrl.scale_request import ScaleError
from tools import chaos

pytestmark = [pytest.mark.system, pytest.mark.elastic]

# chaos's workload (long responses on small engine batches: when an instance retires, requests are
# mid-generation), on one shard, with room for four instances and no restarts of lost ones
WORKLOAD = [
    *(o for o in chaos.WORKLOAD if not o.startswith(("topology.n_ps_shards=", "bus.handshake_timeout_s="))),
    "topology.n_ps_shards=1",
    "topology.max_rollout_instances=4",
    "topology.restart_rollout=false",
    "trainer.total_steps=4",
    "bus.handshake_timeout_s=300",  # a loaded machine starts torch processes slowly
]
WAIT_S = 240.0


def _events(run_dir: Path) -> list[Any]:
    if not (run_dir / "events").is_dir():
        return []
    return [logged.event for logged in EventLogReader(run_dir / "events").events()]


def _wait_for(run_dir: Path, launch: subprocess.Popen[bytes], what: str, condition: Any) -> list[Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        events = _events(run_dir)
        if condition(events):
            return events
        assert launch.poll() is None, f"the run ended before {what}"
        time.sleep(0.3)
    raise TimeoutError(f"no {what} within {WAIT_S:.0f} s")


def _kinds(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e.message, kind)]


def _scale_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "psrl.cli.main", "scale", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _served(events: list[Any], instance: str) -> bool:
    return any(isinstance(e.message, GenerateResult) and e.message.instance == instance for e in events)


def test_rollout_scales_2_4_1_with_a_loss_and_nothing_is_lost(tmp_path: Path) -> None:
    root, name = tmp_path / "runs", "elastic"
    run_dir = root / name
    output = tmp_path / "launch.out"
    with output.open("wb") as sink:
        launch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "psrl.cli.main",
                "launch",
                "demo",
                *WORKLOAD,
                "--name",
                name,
                "--root",
                str(root),
                "--quiet",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(run_dir, launch, "first training step", lambda ev: _kinds(ev, TrainerProgress))

        up = _scale_cli(str(run_dir), "rollout=+2")  # the command line, by run directory
        assert up.returncode == 0, up.stderr
        assert "2 -> 4" in up.stdout and "rollout-2, rollout-3" in up.stdout

        events = _wait_for(run_dir, launch, "work on the new instances",
                           lambda ev: _served(ev, "rollout-2") and _served(ev, "rollout-3"))  # fmt: skip
        with pytest.raises(ScaleError, match="room for 4"):
            psrl.scale(name, "rollout=+1", root=root)  # above the room: refused
        with pytest.raises(ScaleError, match="at least one"):
            psrl.scale(name, "rollout=-4", root=root)  # below one instance: refused

        started = {e.message.actor: e.message.pid for e in _kinds(events, ActorStarted)}
        os.kill(started["rollout-3"], signal.SIGKILL)  # lost for good: restart_rollout=false
        _wait_for(run_dir, launch, "the lost instance leaving the set",
                  lambda ev: any(not e.message.token and e.message.removed == ["rollout-3"]
                                 for e in _kinds(ev, ScaleDecided)))  # fmt: skip

        down = psrl.scale(name, "rollout=1", root=root)  # the Python API, by run name
        assert down.removed == ("rollout-1", "rollout-2") and down.after == ("rollout-0",)
        steps_at_down = len(_kinds(_events(run_dir), TrainerProgress))
        launch.wait(timeout=600)
        assert launch.returncode == 0, output.read_text()[-3000:]
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
            launch.wait(timeout=60)

    finished = _scale_cli(name, "rollout=+1", "--root", str(root))
    assert finished.returncode == 1 and "is finished" in finished.stderr and "--name elastic" in finished.stderr
    unknown = _scale_cli("no-such-run", "rollout=+1", "--root", str(root))
    assert unknown.returncode == 1 and "unknown run 'no-such-run'" in unknown.stderr

    events = _events(run_dir)
    config = load_config("demo", WORKLOAD)
    _check_the_instance_set(events, steps_at_down)
    report = check_invariants(events, config.psrl.staleness)
    assert report.ok, report.violations
    assert report.violations["lost"] == report.violations["duplicated"] == report.violations["mixed_versions"] == 0
    replay = replay_run(run_dir, ["all"])
    for checker in replay.checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])
    agreed = {c.name: c.agreement.num_agree for c in replay.checkers}
    assert agreed["scale"] == 4, agreed  # +2, two refusals, =1 (the loss is no request: not judged)


def _check_the_instance_set(events: list[Any], steps_at_down: int) -> None:
    decided = [e.message for e in _kinds(events, ScaleDecided)]
    accepted = [(d.before, d.added, d.removed) for d in decided if not d.error]
    assert accepted == [
        (["rollout-0", "rollout-1"], ["rollout-2", "rollout-3"], []),
        (["rollout-0", "rollout-1", "rollout-2", "rollout-3"], [], ["rollout-3"]),  # lost
        (["rollout-0", "rollout-1", "rollout-2"], [], ["rollout-1", "rollout-2"]),
    ]
    refused = [d for d in decided if d.error]
    assert len(refused) == 2 and not any(d.added or d.removed for d in refused)
    assert not [e for e in _kinds(events, ActorRestarted) if e.message.actor.startswith("rollout")]
    for added in ("rollout-2", "rollout-3"):  # joined with the current weights, not the initial ones
        first = next(e.message for e in _kinds(events, InstanceStatus) if e.message.instance == added)
        assert first.weight_version >= 1, (added, first.weight_version)
    ready = {e.envelope.sender for e in _kinds(events, Ready) if e.envelope.sender.startswith("rollout")}
    assert ready == {"rollout-0", "rollout-1", "rollout-2", "rollout-3"}
    exited = {e.message.actor: e.message.returncode for e in _kinds(events, ActorExited)}
    assert exited["rollout-3"] == -signal.SIGKILL and exited["rollout-1"] == exited["rollout-2"] == 0
    # once reported drained, a retired instance is routed nothing (the router's own events are in order)
    router = [e for e in events if e.envelope.sender == "router"]
    for instance in ("rollout-1", "rollout-2"):
        drained_at = next(i for i, e in enumerate(router) if isinstance(e.message, InstanceDrained)
                          and e.message.instance == instance)  # fmt: skip
        assert not [e for e in router[drained_at:] if isinstance(e.message, RoutingRecord)
                    and e.message.instance == instance]  # fmt: skip
    assert len(_kinds(events, TrainerProgress)) > steps_at_down  # the run trained on with one instance
