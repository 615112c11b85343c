"""The router, the coordinator and every PS shard SIGKILLed mid-run: the supervisor restarts them, the
new incarnations continue the same run (from the event log; shards from their snapshots), and the log
proves nothing was lost or counted twice."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from bus.eventlog.reader import EventLogReader
from bus.gaps import GapTracker
from bus.messages import ActorRestarted, GenerateRequest, RouterStatus, TrainerProgress
from launch.supervisor import EXIT_OK, Supervisor
from psrl.config import load_config
from psrl.reliability.invariants import check_invariants
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir
from tests.system.run_checks import check_consumed_groups, check_continuations, check_staleness_bound, read_run
from tools import chaos

# minutes each on a loaded 2-core machine: with the other fault-injection runs (make chaos)
pytestmark = [pytest.mark.system, pytest.mark.chaos]

# Long responses on small engine batches: when the kill lands, requests are mid-generation.
WORKLOAD = [
    "psrl.staleness_buffer_entries=8",
    "psrl.rollout_n=4",
    "task.name=demo",
    "engine.cpu_kernels=off",
    "trainer.total_steps=3",
    "task.response_lengths=long_tail",
    "task.long_tail_median=120",
    "engine.max_num_seqs=4",
    "task.max_response_length=320",
    "bus.handshake_timeout_s=300",  # a loaded machine starts torch processes slowly
]


def kill_once_trained(targets: tuple[str, ...], killed: dict[str, Any]) -> Any:
    """SIGKILL ``targets`` together once the trainer has pushed its first version (buffers are then in
    every state)."""

    def kill(sup: Supervisor) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not sup.is_stopping:
            trained = any(isinstance(e.message, TrainerProgress) for e in _events(sup))
            procs = [sup.processes.get(target) for target in targets]
            if trained and all(proc is not None and proc.is_ready for proc in procs):
                time.sleep(1.0)
                killed["at"] = time.time()
                for target, proc in zip(targets, procs, strict=True):
                    assert proc is not None
                    killed[target] = proc.incarnation
                    os.kill(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.5)

    return kill


def _events(sup: Supervisor) -> list[Any]:
    return [logged.event for logged in EventLogReader(sup.run_dir.events).events()]


def run_with_kill(tmp_path: Any, *targets: str) -> tuple[Any, Supervisor, list[Any]]:
    config = load_config("demo", WORKLOAD)
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", f"kill-{'-'.join(targets)}"))
    killed: dict[str, Any] = {}
    threading.Thread(target=kill_once_trained(targets, killed), args=(sup,), daemon=True).start()
    code = sup.run()
    assert code == EXIT_OK, sup.end_reason
    assert "at" in killed, f"{targets} were never killed"
    events = _events(sup)
    restarts = [e.message for e in events if isinstance(e.message, ActorRestarted)]
    assert sorted((r.actor, r.old_incarnation) for r in restarts) == sorted((t, killed[t]) for t in targets)
    return config, sup, events


def check_nothing_lost(config: Any, sup: Supervisor, events: list[Any]) -> None:
    facts = read_run(sup.run_dir.events)
    check_staleness_bound(facts, config.psrl.staleness)
    check_consumed_groups(facts, config.psrl.rollout_n, config.responses_per_prompt, config.psrl.staleness)
    check_continuations(facts)
    consumed = [b for b, _, _, _ in facts.consumed]  # the trainer may take a buffer beyond its last step
    assert consumed == list(range(len(consumed))) and len(consumed) >= config.trainer.total_steps, consumed
    report = check_invariants(events, config.psrl.staleness)
    assert report.ok, report.violations
    assert report.num_buffers_consumed >= config.trainer.total_steps
    replay = replay_run(sup.run_dir.path, ["all"])
    for checker in replay.checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])
    agreed = {c.name: c.agreement.num_agree for c in replay.checkers}
    assert all(agreed[name] > 0 for name in ("ledger", "routing", "sequence", "staleness", "sync")), agreed


def test_a_router_killed_mid_run_is_replaced_and_the_run_loses_nothing(tmp_path) -> None:
    config, sup, events = run_with_kill(tmp_path, "router")
    statuses = [e for e in events if isinstance(e.message, RouterStatus)]
    assert any(e.message.recovered and e.envelope.incarnation == 1 for e in statuses), "no rebuilt router reported"
    check_nothing_lost(config, sup, events)


def test_a_coordinator_killed_mid_run_is_replaced_and_the_run_loses_nothing(tmp_path) -> None:
    config, sup, events = run_with_kill(tmp_path, "coordinator")
    requests = [e for e in events if isinstance(e.message, GenerateRequest) and e.envelope.sender.startswith("coord")]
    senders: dict[int, list[int]] = {}
    for e in requests:
        senders.setdefault(e.message.request_id, []).append(e.envelope.incarnation)
    # a request sent again is one the dead coordinator's link logged and no router event named (it may
    # have died in the socket): once by the new coordinator; the router takes each id once
    assert all(incs in ([0], [1], [0, 1]) for incs in senders.values()), "a request was sent twice"
    assert any(e.envelope.incarnation == 1 for e in requests), "the new coordinator dispatched nothing"
    check_nothing_lost(config, sup, events)


def test_every_ps_shard_killed_after_a_publication_is_restored_and_the_run_loses_nothing(tmp_path) -> None:
    # Without snapshots no shard would hold the published version any more: instances could not sync,
    # the trainer would wait for rollouts that cannot start, and the run would stop making progress.
    config, sup, events = run_with_kill(tmp_path, "ps-0", "ps-1")
    restored = [line for line in _actor_log_lines(sup, "ps-") if "ps.shard.restored" in line]
    assert len(restored) == 2, restored
    check_nothing_lost(config, sup, events)
    assert not list((sup.run_dir.path / "ps").glob("*.data")), "a finished run keeps no shard snapshots"


def test_a_logger_killed_mid_run_is_replaced_and_the_log_misses_nothing(tmp_path) -> None:
    # The replacement catches up from the proxy's retainer: what was sent while no logger wrote is
    # logged in order, so the log has no gaps and the router and coordinator could rebuild from it.
    config, sup, events = run_with_kill(tmp_path, "logger")
    gaps = GapTracker(from_first_seen=False)
    for event in events:
        gaps.observe(event.envelope)
    assert gaps.num_missing == 0
    ids = [e.envelope.event_id for e in events]
    assert len(ids) == len(set(ids)), "an event was logged twice"
    check_nothing_lost(config, sup, events)


def test_the_night_plan_over_curve_instance_shard_then_router_just_after_a_publish(tmp_path) -> None:
    """An instance, a shard, then the router just after a version is published (it is down while the
    instances load it and the coordinator's requests queue for it), over CURVE: the run finishes and
    the log shows nothing lost; every fault healed."""
    # each fault waits for a warm spare (about 10 s to start on 2 cores), so the three take half a minute
    # or more; the run must still be training when the last one lands, however fast its steps are
    config = load_config("demo", [*WORKLOAD, "bus.curve=on", "trainer.total_steps=30"])
    plan = chaos.Plan((), 0, 0.0, explicit="rollout-0@1,ps-1@1,router@publish+0.1")
    case = chaos.run_case(11, config, plan, tmp_path / "runs")
    assert case.exit_code == EXIT_OK, case.reason
    assert case.report.ok, case.report.violations
    assert not case.skipped, case.skipped
    assert [(r.fault.target, r.fault.anchor) for r in case.recoveries] == [
        ("rollout-0", ""), ("ps-1", ""), ("router", "publish")
    ]  # fmt: skip
    assert all(r.seconds is not None for r in case.recoveries), case.recoveries


def _actor_log_lines(sup: Supervisor, prefix: str) -> list[str]:
    lines: list[str] = []
    for path in sorted((sup.run_dir.path / "logs").glob(f"{prefix}*.jsonl")):
        lines.extend(path.read_text(errors="replace").splitlines())
    return lines
