"""A router restarted while the instances load newer weights, with requests queued in its absence.

The run this mirrors: the trainer falls behind, the ledger runs ``staleness`` buffers ahead of it,
the router dies, the trainer catches up and the instances load the new versions while the router is
down (their ``wt.loaded`` goes to nobody), and the coordinator keeps sending requests. The
replacement meets each instance through the status reports its link queued, oldest first, so it
joins them at the old version; only the later reports say what they hold now. A router that kept
the version it joined them at found no instance fresh enough for the next buffer and never routed
again.
"""

from __future__ import annotations

from bus.messages import GenerateRequest, InstanceStatus, RoutingRecord
from psrl.config import load_config
from psrl.coordination.instances import InstanceBook
from psrl.flows.router import RouterFlow
from psrl.flows.status import snapshot_from_status
from tests.flows.flow_helpers import status
from tests.flows.restart_harness import RestartableRun

STALENESS = 2
STEPS = 10
CONFIG = [
    "psrl.staleness_buffer_entries=4",
    "psrl.rollout_n=4",
    "actor.ppo_mini_batch_size=4",
    f"psrl.staleness={STALENESS}",
    f"trainer.total_steps={STEPS}",
]


def _run_to_the_restart() -> tuple[RestartableRun, int]:
    """Up to the router's restart; returns the run and the trainer's version when the router died."""
    run = RestartableRun(load_config("demo", CONFIG))
    run.start()
    run.rounds_until(lambda: len(run.record.progress) >= 2, 20_000)
    run.stall_trainer()
    killed_at = run.record.progress[-1].version
    run.rounds_until(lambda: run.router.ledger.next_buffer_id > killed_at + STALENESS, 20_000)
    run.kill_router()
    for _ in range(50):  # statuses at the old version queue for the dead router
        run.round()
    run.release_trainer()
    run.rounds_until(lambda: min(i.engine.weight_version for i in run.instances) > killed_at + STALENESS, 20_000)
    return run, killed_at


def test_a_router_rebuilt_while_instances_loaded_newer_weights_routes_what_queued_meanwhile() -> None:
    run, killed_at = _run_to_the_restart()
    held_statuses = [m.weight_version for s, m in run.held if isinstance(m, InstanceStatus)]
    assert min(held_statuses) <= killed_at < max(held_statuses), "the queued reports span the load"
    assert any(isinstance(m, GenerateRequest) for _, m in run.held), "requests queued during its absence"
    records_before = sum(isinstance(e.message, RoutingRecord) for e in run.log.events)

    router = run.restart_router()
    loaded = {i.name: i.engine.weight_version for i in run.instances}
    assert router.instances == loaded, "the replacement knows what each instance holds now"
    run.rounds_until(lambda: run.record.finished is not None, 20_000)
    assert run.record.finished is not None and run.record.finished.success
    assert [p.version for p in run.record.progress] == list(range(1, STEPS + 1))
    assert sum(isinstance(e.message, RoutingRecord) for e in run.log.events) > records_before


def test_a_report_of_a_newer_version_is_a_load_the_router_missed() -> None:
    flow = RouterFlow(load_config("demo", CONFIG))
    flow.start(0.0)
    flow.handle(status("rollout-0", version=3, seq=1), 0.0)
    flow.handle(status("rollout-0", version=6, seq=2), 0.1)
    assert flow.instances["rollout-0"] == 6 and flow.core.cluster.view("rollout-0").version == 6
    flow.handle(status("rollout-0", version=5, seq=1), 0.2)  # an older report, late: no step back
    assert flow.instances["rollout-0"] == 6


def test_the_coordinators_book_takes_a_version_it_only_heard_of_in_a_report() -> None:
    book = InstanceBook()
    book.report(snapshot_from_status(status("rollout-0", version=3, seq=1)))
    book.sync_started("rollout-0", 1.0)
    book.report(snapshot_from_status(status("rollout-0", version=5, seq=2)))
    (state,) = book.states()
    assert state.version == 5 and not state.is_syncing and state.stale_report_version == 3
