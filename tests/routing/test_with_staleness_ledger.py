"""Routing against the real staleness ledger (psrl.staleness): placement respects its windows."""

from __future__ import annotations

from routing_helpers import request

from psrl.config.coordination import RoutingStrategy
from psrl.routing import Reason, RouterCore, RoutingDecision, make_policy
from psrl.staleness.ledger import StalenessLedger
from psrl.staleness.types import FinishVerdict, LedgerSizes


def finish_group(core: RouterCore, ledger: StalenessLedger, prompt_id: int, children: int) -> None:
    for child in range(children):
        rid = prompt_id * children + child
        core.release(rid)
        outcome = ledger.finish_child(prompt_id, child)
    assert outcome.verdict == FinishVerdict.GROUP_COMPLETE
    ledger.occupy(prompt_id)


def test_trajectories_land_inside_their_window_and_wait_for_room() -> None:
    ledger = StalenessLedger(
        LedgerSizes(staleness=1, num_slots=2, ready_entries=2, alg_rollout_n=2, redundant_rollout_n=2)
    )
    config = RoutingStrategy(method="request_num_balance", enable_group_sticky=True)
    core = RouterCore(config, ledger, make_policy(config))
    core.add_instance("i0", 0)
    core.add_instance("i1", 0)
    for prompt_id in range(6):
        for child in range(2):
            core.submit(request(prompt_id * 2 + child, prompt_id, child_index=child))
    first = core.dispatch(0.0)
    routed: list[RoutingDecision] = list(first.routed)
    # Version 0 may land in buffers 0 and 1 (2 groups each): 4 groups fit, 2 must wait.
    assert {d.prompt_id for d in routed} == {0, 1, 2, 3}
    assert {d.reason for d in first.deferred} == {Reason.NO_RESERVABLE}
    assert core.num_queued == 4

    for prompt_id in sorted({d.prompt_id for d in routed if d.reserved_buffer == 0}):
        finish_group(core, ledger, prompt_id, 2)
    ledger.consume(0)  # the trainer takes buffer 0 and publishes version 1
    core.set_version("i0", 1)
    core.notify_ledger_changed()
    second = core.dispatch(1.0).routed
    routed += second
    assert {d.prompt_id for d in second} == {4, 5}
    assert {d.instance_id for d in second} == {"i0"}  # version 0 has no room left: only i0 (v1) can take them
    for d in routed:
        assert d.reserved_buffer is None or d.version_tag <= d.reserved_buffer <= d.version_tag + 1
    assert ledger.num_bound_violations == 0
