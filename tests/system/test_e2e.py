"""The whole system on one machine, with real processes: short runs of the demo, checked from the log."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from bus.messages import WeightsLoaded
from launch.supervisor import INCARNATIONS_PER_LAUNCH, Supervisor
from psrl.config import load_config
from psrl.replay.runner import replay_run
from psrl.rundir import RunDir
from tests.system.run_checks import (
    check_consumed_groups,
    check_continuations,
    check_staleness_bound,
    finished,
    read_run,
)

pytestmark = pytest.mark.system

# Small buffers of the long-answer task (fast runs).
SMALL = ["psrl.staleness_buffer_entries=8", "psrl.rollout_n=4", "task.name=demo"]
# Long responses on small engine batches, so generation outlasts training steps and syncs interrupt it.
# Eager decode: the fused CPU kernels generate 2-5x faster at these batch sizes, which lets every
# request finish between syncs and leaves partial rollout and the instance kill nothing to act on.
LONG = [
    *SMALL,
    "engine.cpu_kernels=off",
    "trainer.total_steps=4",
    "task.response_lengths=long_tail",
    "task.long_tail_median=200",
    "engine.max_num_seqs=2",
    "task.max_response_length=400",
    "bus.handshake_timeout_s=120",
]


def run(tmp_path, overrides, during=None):
    config = load_config("demo", overrides)
    sup = Supervisor(config, RunDir.create(tmp_path / "runs", "e2e"))
    if during is not None:
        threading.Thread(target=during, args=(sup,), daemon=True).start()
    code = sup.run()
    return config, sup, code


def test_partial_rollout_run_keeps_every_promise(tmp_path) -> None:
    config, sup, code = run(tmp_path, LONG)
    assert code == 0, sup.end_reason
    facts = read_run(sup.run_dir.events)
    check_staleness_bound(facts, config.psrl.staleness)
    check_consumed_groups(facts, config.psrl.rollout_n, config.responses_per_prompt, config.psrl.staleness)
    assert check_continuations(facts) > 0, "no request was interrupted: the test exercised no partial rollout"
    loads = [e.message for e in facts.events if isinstance(e.message, WeightsLoaded)]
    assert any(load.prefetched for load in loads), "no sync loaded a version pulled in the background"
    assert all(0 < load.pull_ms <= load.load_ms for load in loads), "a sync's pull is part of its stop"
    report = replay_run(sup.run_dir.path, ["routing", "sync", "ledger"])
    for checker in report.checkers:
        assert checker.agreement.num_disagree == 0, checker.name
        assert checker.agreement.num_agree > 0, checker.name


def test_killing_an_instance_mid_run_loses_no_trajectory(tmp_path) -> None:
    killed: dict[str, float] = {}

    def kill_rollout_0(sup: Supervisor) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            proc = sup.processes.get("rollout-0")
            if proc is not None and proc.is_ready and sup.run_dir.read_state().get("status") == "running":
                time.sleep(4.0)  # let requests pile onto it
                killed["at"] = time.time()
                os.kill(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    config, sup, code = run(tmp_path, LONG, during=kill_rollout_0)
    assert code == 0, sup.end_reason
    assert "at" in killed
    facts = read_run(sup.run_dir.events)
    check_consumed_groups(facts, config.psrl.rollout_n, config.responses_per_prompt, config.psrl.staleness)
    orphans = [rid for rid, routes in facts.routed.items()
               if any(inst == "rollout-0" and t < killed["at"] for inst, _, t in routes)
               and not any(finished(r) and when < killed["at"]
                           for r, when in zip(facts.results[rid], facts.result_times[rid], strict=True))]  # fmt: skip
    assert orphans, "nothing was running on the killed instance"
    consumed_prompts = {p for _, groups, _, _ in facts.consumed for p in groups}
    for rid in orphans:
        later = [r for r in facts.results[rid] if finished(r)]
        prompt_id = rid // config.responses_per_prompt
        if prompt_id in consumed_prompts:
            assert later, f"request {rid} of a consumed group never finished"
        rerouted = [inst for inst, _, t in facts.routed[rid] if t > killed["at"]]
        assert rerouted or later, f"request {rid} was neither re-routed nor finished"


def test_proactive_truncate_completes_stuck_buffers(tmp_path) -> None:
    pf = "psrl.rollout_coordination.proactive_filter_strategy"
    overrides = [*SMALL, "trainer.total_steps=3", "psrl.staleness=0",
                 "psrl.rollout_coordination.partial_rollout.enable=False",
                 f"{pf}.method=truncate", f"{pf}.threshold=2", "task.response_lengths=long_tail",
                 "task.long_tail_median=60", "task.long_tail_sigma=1.2", "task.max_response_length=450"]  # fmt: skip
    config, sup, code = run(tmp_path, overrides)
    assert code == 0, sup.end_reason
    facts = read_run(sup.run_dir.events)
    truncated = [r for results in facts.results.values() for r in results if r.error == "truncate"]
    assert truncated, "no straggler was truncated"
    check_staleness_bound(facts, 0)
    check_consumed_groups(facts, config.psrl.rollout_n, config.responses_per_prompt, 0)
    report = replay_run(sup.run_dir.path, ["ledger"])
    assert report.checkers[0].agreement.num_disagree == 0


def test_a_resumed_run_continues_the_version_numbering(tmp_path) -> None:
    from bus.eventlog.reader import EventLogReader
    from bus.messages import LedgerOp, RouterStatus, RoutingRecord, TrainerProgress

    first = load_config("demo", [*SMALL, "trainer.total_steps=2"])
    run_dir = RunDir.create(tmp_path / "runs", "resume")
    assert Supervisor(first, run_dir).run() == 0
    second = load_config("demo", [*SMALL, "trainer.total_steps=4"])
    assert Supervisor(second, run_dir).run() == 0
    events = [e.event for e in EventLogReader(run_dir.events).events()]
    progress = [e for e in events if isinstance(e.message, TrainerProgress)]
    # Ledger replay starts each router incarnation's ledger from its status: it must come first.
    first_router_kind = {}
    for e in events:
        if isinstance(e.message, (LedgerOp, RouterStatus, RoutingRecord)):
            first_router_kind.setdefault(e.envelope.incarnation, type(e.message))
    assert list(first_router_kind.values()) == [RouterStatus, RouterStatus]
    # A trainer restarted inside a launch (a missed heartbeat on a loaded machine) gets the next
    # incarnation of that launch: group by launch, not by incarnation.
    by_launch: dict[int, list[int]] = {}
    for e in progress:
        by_launch.setdefault(e.envelope.incarnation // INCARNATIONS_PER_LAUNCH, []).append(e.message.version)
    (first_versions, second_versions) = [sorted(v) for _, v in sorted(by_launch.items())]
    assert first_versions[:2] == [1, 2] and second_versions[:2] == [3, 4]
    report = replay_run(run_dir.path, ["all"])
    for checker in report.checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])


def test_a_data_parallel_trainer_steps_in_lockstep_and_one_rank_pushes(tmp_path) -> None:
    from bus.eventlog.reader import EventLogReader
    from bus.messages import TrainerProgress, WeightsPushed

    config, sup, code = run(tmp_path, [*SMALL, "topology.n_trainer_ranks=2", "trainer.total_steps=3"])
    assert code == 0, sup.end_reason
    events = [e.event for e in EventLogReader(sup.run_dir.events).events()]
    versions: dict[str, list[int]] = {}
    for e in events:
        if isinstance(e.message, TrainerProgress):
            versions.setdefault(e.envelope.sender, []).append(e.message.version)
    assert versions == {"trainer-0": [1, 2, 3], "trainer-1": [1, 2, 3]}
    # The ranks gather their shards (FSDP2, the default) and rank 0 alone pushes each whole version.
    pushes = [(e.envelope.sender, e.message.version) for e in events if isinstance(e.message, WeightsPushed)]
    assert pushes == [("trainer-0", 1), ("trainer-0", 2), ("trainer-0", 3)]
    check_staleness_bound(read_run(sup.run_dir.events), config.psrl.staleness)
    for checker in replay_run(sup.run_dir.path, ["all"]).checkers:
        assert checker.agreement.num_disagree == 0, (checker.name, checker.agreement.disagreements[:3])
