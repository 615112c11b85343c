"""The router's side of elastic rollout: a retiring instance gets no new work, hands its requests back
to continue elsewhere from their exact tokens, and is reported drained; the coordinator's view and the
session scheduler's capacity view drop it."""

from __future__ import annotations

import numpy as np

from bus.messages import (
    Abort,
    GenerateRequest,
    InstanceDrained,
    ScaleDecided,
    WeightsLoaded,
)
from psrl.config import load_config
from psrl.coordination.instances import InstanceBook
from psrl.flows.effects import Effect
from psrl.flows.router import DRAIN, RouterFlow
from psrl.flows.status import snapshot_from_status
from tests.flows.flow_helpers import destinations, published, request, result, sent, status

SMALL = ["psrl.staleness_buffer_entries=2", "psrl.rollout_n=2", "psrl.staleness=1", "actor.ppo_mini_batch_size=2"]
N = 2


def _router() -> RouterFlow:
    flow = RouterFlow(load_config("demo", SMALL))
    flow.start(0.0)
    for name in ("rollout-0", "rollout-1"):
        flow.handle(status(name), 0.0)
    return flow


def _submit(flow: RouterFlow, prompt_id: int) -> list[Effect]:
    effects: list[Effect] = []
    for child in range(N):
        effects += flow.handle(request(prompt_id * N + child, N), 0.0)
    return effects + flow.route(0.0)


def _removed(*names: str, error: str = "") -> ScaleDecided:
    before = ["rollout-0", "rollout-1"]
    return ScaleDecided(
        token="t", role="rollout", delta=-len(names), target=-1, before=before, limit=4, next_index=2,
        removed=[] if error else list(names), error=error,
    )  # fmt: skip


def test_a_retiring_instance_hands_its_requests_back_and_they_continue_elsewhere_from_their_tokens() -> None:
    flow = _router()
    effects = _submit(flow, 0) + _submit(flow, 1)
    routed = sent(effects, GenerateRequest)
    on_1 = [r for r, where in zip(routed, destinations(effects, GenerateRequest), strict=True) if where == "rollout-1"]
    assert on_1, "the test needs requests on the instance it retires"
    out = flow.handle(_removed("rollout-1"), 1.0)
    [abort] = sent(out, Abort, to="rollout-1")
    assert abort.reason == DRAIN and sorted(abort.request_ids) == sorted(r.request_id for r in on_1)
    assert not published(out, InstanceDrained)  # its requests are still out
    handed_back = []
    for req in on_1:
        back = result(req, "rollout-1", num_tokens=5, error=DRAIN)
        handed_back.append(back)
        out = flow.handle(back, 2.0)
    [drained] = published(out, InstanceDrained)
    assert drained.instance == "rollout-1" and drained.num_moved == len(on_1)
    again = flow.route(3.0)
    moved = sent(again, GenerateRequest)
    assert sorted(r.request_id for r in moved) == sorted(r.request_id for r in on_1)
    assert set(destinations(again, GenerateRequest)) == {"rollout-0"}
    for req, back in zip(sorted(moved, key=lambda r: r.request_id), sorted(handed_back, key=lambda r: r.request_id),
                         strict=True):  # fmt: skip
        assert req.generated_token_ids is not None
        np.testing.assert_array_equal(req.generated_token_ids, back.token_ids)  # exactly the tokens it had
        np.testing.assert_array_equal(req.generated_versions, back.versions)


def test_a_retiring_instance_gets_no_new_work_even_after_it_loads_a_version() -> None:
    flow = _router()
    flow.handle(_removed("rollout-1"), 0.5)
    flow.handle(WeightsLoaded(instance="rollout-1", version=1), 0.6)  # a sync it was in the middle of
    effects = _submit(flow, 0) + _submit(flow, 1) + _submit(flow, 2)
    assert sent(effects, GenerateRequest) and set(destinations(effects, GenerateRequest)) == {"rollout-0"}
    assert flow._status().versions == [0]  # its version no longer counts as servable


def test_an_idle_instance_is_drained_at_once_and_a_refused_request_changes_nothing() -> None:
    flow = _router()
    assert not flow.handle(_removed("rollout-1", error="refused"), 0.5)
    out = flow.handle(_removed("rollout-1"), 1.0)
    assert not sent(out, Abort)
    assert [d.instance for d in published(out, InstanceDrained)] == ["rollout-1"]


def test_an_added_instance_joins_routing_with_its_first_report() -> None:
    flow = _router()
    flow.handle(_removed("rollout-1"), 0.5)
    flow.handle(status("rollout-2"), 1.0)
    effects = _submit(flow, 0) + _submit(flow, 1)
    assert set(destinations(effects, GenerateRequest)) == {"rollout-0", "rollout-2"}


def test_the_coordinators_view_drops_a_retired_instance_and_ignores_its_later_reports() -> None:
    book = InstanceBook()
    book.report(snapshot_from_status(status("rollout-0")))
    book.report(snapshot_from_status(status("rollout-1")))
    book.retire("rollout-1")
    book.report(snapshot_from_status(status("rollout-1", seq=2)))  # sent while it drained
    assert [s.instance_id for s in book.states()] == ["rollout-0"]


def test_a_restarted_router_and_coordinator_know_which_instances_retire() -> None:
    from bus.messages import ActorExited
    from psrl.flows.router_recovery import rebuild_router
    from psrl.staleness.types import LedgerSizes
    from tests.flows.flow_helpers import LoggedEvents

    log = LoggedEvents()
    log.add("supervisor", _removed("rollout-1"))
    log.add("supervisor", ScaleDecided(token="u", role="rollout", delta=1, target=-1, before=["rollout-0"], limit=4,
                                       next_index=2, added=["rollout-2"]))  # fmt: skip
    log.add("supervisor", _removed("rollout-0", error="would leave 0"))  # refused: nothing retires
    config = load_config("demo", SMALL)
    recovery = rebuild_router(log.events, LedgerSizes.from_config(config), 0)
    assert recovery.retiring == ["rollout-1"]
    log.add("supervisor", ActorExited(actor="rollout-1", incarnation=0, returncode=0))
    assert rebuild_router(log.events, LedgerSizes.from_config(config), 0).retiring == []
    flow = RouterFlow(config, recovery=recovery)
    out = flow.start(0.0)
    assert [d.instance for d in published(out, InstanceDrained)] == ["rollout-1"]  # it holds nothing routed here
    flow.handle(status("rollout-0"), 0.1)
    flow.handle(status("rollout-1"), 0.1)  # its report while it drains: it does not join
    assert sorted(flow.instances) == ["rollout-0"]


def test_a_request_that_never_reached_its_instance_is_routed_again_as_it_was_and_the_instance_rests() -> None:
    from psrl.flows.effects import Send

    flow = _router()
    effects = _submit(flow, 0)
    routed = dict(zip(destinations(effects, GenerateRequest), sent(effects, GenerateRequest), strict=False))
    lost = routed["rollout-1"]
    flow.undeliverable(Send("rollout-1", lost), 1.0)  # rollout-1 is gone (or restarting)
    assert flow.tracker.live[lost.request_id].flags == 0  # nothing of it ran: not an interruption
    again = flow.route(1.1)
    assert [(r.request_id, where) for r, where in zip(sent(again, GenerateRequest),
            destinations(again, GenerateRequest), strict=True)] == [(lost.request_id, "rollout-0")]  # fmt: skip
    more = _submit(flow, 1)
    assert set(destinations(more, GenerateRequest)) == {"rollout-0"}  # out of rotation until it reports
    flow.handle(status("rollout-1", seq=2), 2.0)
    back = _submit(flow, 2)
    assert "rollout-1" in destinations(back, GenerateRequest)
