"""Hostile input on every bound socket of a live run, and actors killed mid-run, checked from the log."""

from __future__ import annotations

import pytest

from bus.eventlog.reader import EventLogReader
from bus.messages import SessionEnd, TurnDone
from launch.supervisor import EXIT_OK
from psrl.config import load_config
from psrl.rundir import RunDir
from tools import chaos, fuzz_bus

pytestmark = pytest.mark.system


def test_every_bound_socket_survives_hostile_frames_and_the_run_completes(tmp_path) -> None:
    config = load_config("demo", [*fuzz_bus.WORKLOAD, f"trainer.total_steps={fuzz_bus.STEP_LIMIT}"])
    outcome = fuzz_bus.run_fuzz(config, frames=500, seed=5, root=tmp_path / "runs")
    assert fuzz_bus.ran_ok(outcome), (outcome.exit_code, outcome.reason)
    assert outcome.error is None and outcome.outlasted and outcome.versions_after >= 3
    assert len(outcome.results) == outcome.num_targets == 9  # 2 links, 2 shards x 2, 3 proxy sockets
    assert all(r.sent + r.unsent == 500 for r in outcome.results)
    assert outcome.deaths == 0 and outcome.restarts == 0
    assert fuzz_bus.uncounted(outcome.results, outcome.drops) == 0, outcome.drops
    assert all(agree == total > 0 for agree, total in outcome.replay.values()), outcome.replay


@pytest.mark.chaos
def test_killed_and_hung_instances_shards_and_trainer_keep_every_promise(tmp_path) -> None:
    # steps enough to outlast the warm spare's start (faults wait for it) and three faults with their recoveries
    config = load_config("demo", [*chaos.WORKLOAD, "trainer.total_steps=40"])
    case = chaos.run_case(3, config, chaos.Plan(("rollout", "ps", "trainer"), 3, 4.0), tmp_path / "runs")
    assert case.exit_code == EXIT_OK, case.reason
    assert case.report.ok, case.report.violations
    assert len(case.recoveries) == 3 and all(r.seconds is not None for r in case.recoveries)


@pytest.mark.chaos
def test_a_trainer_killed_or_hung_with_a_push_in_the_background_keeps_every_promise(tmp_path) -> None:
    config = load_config("demo", [*chaos.WORKLOAD, "trainer.total_steps=30", "trainer.background_push=true"])
    case = chaos.run_case(7, config, chaos.Plan(("trainer",), 2, 3.0), tmp_path / "runs")
    assert case.exit_code == EXIT_OK, case.reason
    assert case.report.ok, case.report.violations
    assert len(case.recoveries) == 2 and all(r.seconds is not None for r in case.recoveries)


@pytest.mark.chaos
def test_killed_and_hung_session_scheduler_and_killed_env_workers_lose_no_session(tmp_path) -> None:
    config = load_config("agentic", [*chaos.AGENTIC_WORKLOAD, "trainer.total_steps=4"])
    case = chaos.run_case(2, config, chaos.Plan(("session", "env"), 4, 4.0), tmp_path / "runs")
    assert case.exit_code == EXIT_OK, case.reason
    assert case.report.ok, case.report.violations
    assert {r.fault.target for r in case.recoveries} == {"session", "session/env"}
    assert len(case.recoveries) == 4 and all(r.seconds is not None for r in case.recoveries)
    sessions = case.report.sessions
    assert not [reason for reason in sessions.failed if "scheduler" in reason or "history" in reason]
    # sessions the scheduler had taken over when it died went on to their end in its replacement
    events = [e.event for e in EventLogReader(RunDir(tmp_path / "runs" / "chaos-2").events).events()]
    assert _sessions_across(events, [r.fault.wall_s for r in case.recoveries if r.fault.target == "session"])


def _sessions_across(events: list, fault_times: list[float]) -> set[int]:
    """Sessions with a turn handed over before a fault and their end after it."""
    handed: dict[int, float] = {}
    across = set()
    for event in events:
        wall_s, msg = event.envelope.wall_ns / 1e9, event.message
        if isinstance(msg, TurnDone):
            handed.setdefault(msg.request_id, wall_s)
        elif (
            isinstance(msg, SessionEnd)
            and not msg.error
            and any(handed.get(msg.request_id, wall_s) < t < wall_s for t in fault_times)
        ):
            across.add(msg.request_id)
    return across
