"""Checkers for the run's decision code: routing policy, sync/migration ticks, staleness ledger.

Each re-runs the decision code of the flows the actors ran (``psrl.flows``), built from the run's
config as the flows build it, on inputs recorded in the log:

* ``routing``: every routed request's `router.decision` record holds the inputs worker
  selection saw; selection and the policy are re-run on them.
* ``sync``: every `coord.tick` record holds the coordinator's inputs; the sync strategy and
  migration are re-run on them.
* ``ledger``: the router logs every call on the staleness ledger (`ledger.op`, reservations in
  `router.decision`); a fresh ledger re-runs them in order and must reach the same outcomes.

With ``--what-if`` overrides the checkers are built from the changed config and the mismatches
are the decisions those settings would have changed.
"""

from __future__ import annotations

from typing import Any

from bus.messages import LedgerOp, RoutingRecord, TickRecord
from bus.schema import Event
from psrl.config import Config
from psrl.coordination.records import decode_tick
from psrl.coordination.tick import decide_tick
from psrl.engine_cost.model import CostModel, load_cost_model
from psrl.flows.coordinator import make_sync_policy
from psrl.flows.router import effective_routing
from psrl.replay.checker import Checker, NotJudged, register_checker
from psrl.routing.decision import RoutingDecision
from psrl.routing.policies import make_policy
from psrl.routing.replay import Replayed, replay_decision
from psrl.routing.selector import SelectionSettings
from psrl.staleness.log_replay import LedgerReplay, routing_decision
from psrl.staleness.types import LedgerSizes


def _cost_model(config: Config) -> CostModel | None:
    path = config.psrl.rollout_coordination.routing_strategy.cost_model_path
    return load_cost_model(path) if path else None


def _decision(event: Event[RoutingRecord]) -> RoutingDecision:
    return routing_decision(event.message)


NO_INPUTS = "recorded without its inputs"


def _why_no_reservation(decision: RoutingDecision) -> str:
    """Why a routing decision holds no ledger call to re-run (only a group's first routing reserves)."""
    if decision.inputs is None:
        return NO_INPUTS
    if decision.instance_id is None:
        return "left the request queued (nothing reserved)"
    return "routed a request its first routing already reserved for (a later turn, a continuation or a migration)"


@register_checker
class RoutingChecker(Checker):
    """Each routing decision re-made by the routing policy from its recorded inputs."""

    name = "routing"
    decisions = ("router.decision",)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        routing = effective_routing(config)
        self.settings = SelectionSettings.from_config(routing)
        self.policy = make_policy(routing, _cost_model(config))

    def redecide(self, event: Event[Any]) -> Replayed | NotJudged:
        decision = _decision(event)
        if decision.inputs is None:
            return NotJudged(NO_INPUTS)
        return replay_decision(decision, self.settings, self.policy)

    def recorded(self, event: Event[Any]) -> Replayed:
        decision = _decision(event)
        return Replayed(decision.instance_id, decision.reason)


@register_checker
class SyncChecker(Checker):
    """Each coordinator tick's weight-sync and migration decision re-made from its recorded inputs."""

    name = "sync"
    decisions = ("coord.tick",)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.settings = config.psrl.rollout_coordination.sync_and_mig_strategy
        self.policy = make_sync_policy(config, _cost_model(config))

    def redecide(self, event: Event[Any]) -> tuple[tuple[str, ...], str]:
        log = decode_tick(event.message.record)
        decision = decide_tick(log.inputs, self.policy, self.settings)
        return decision.sync.instance_ids, decision.migration.source_id if decision.migration else ""

    def recorded(self, event: Event[TickRecord]) -> tuple[tuple[str, ...], str]:
        return tuple(event.message.synced), event.message.migrated


@register_checker
class LedgerChecker(Checker):
    """The staleness ledger's calls re-run in log order: each outcome must be the recorded one."""

    name = "ledger"
    inputs = ("router.status",)
    decisions = ("ledger.op", "router.decision")

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.replay = LedgerReplay(LedgerSizes.from_config(config))

    def observe(self, event: Event[Any]) -> None:
        """A new router incarnation starts from a fresh ledger, or continues a crashed one's (recovered)."""
        self.replay.on_status(event)

    def redecide(self, event: Event[Any]) -> Any | None:
        outcome = self.replay.apply(event)
        return NotJudged(_why_no_reservation(_decision(event))) if outcome is None else outcome

    def recorded(self, event: Event[Any]) -> Any:
        msg = event.message
        if isinstance(msg, LedgerOp):
            return msg.outcome
        return _decision(event).reserved_buffer
