"""The router actor: ``psrl.flows.RouterFlow`` on the router's link, routing between handled messages.

Instances and the coordinator connect to the router's link (it serves a ROUTER socket); sync and
instance events come from the bus. The loop routes queued requests between batches of messages.

A router restarted within a launch (``restarted``) first rebuilds what its predecessor left from
the run's event log (``psrl.flows.router_recovery``): the staleness ledger, the live trajectories
and the coordinator's commands it never handled. The coordinator's messages that were already in
the log when it read it are handled there, so when the link delivers one of them (sent while no
router was listening) it is dropped here: each is handled once.
"""

from __future__ import annotations

import time

from actors.flow_actor import FlowActor
from psrl.engine_cost.model import load_cost_model
from psrl.flows.router import RouterFlow
from psrl.flows.router_recovery import RouterRecovery, rebuild_router
from psrl.launches import launch_of
from psrl.staleness.types import LedgerSizes


class RouterActor(FlowActor):
    ROLE = "router"
    SERVES_REQUESTS = True
    FLOW = RouterFlow
    flow: RouterFlow

    def setup(self) -> dict[str, int]:
        routing = self.config.psrl.rollout_coordination.routing_strategy
        cost = load_cost_model(routing.cost_model_path) if routing.cost_model_path else None
        self.already_handled: set[str] = set()
        recovery = self._rebuild() if self.boot.options.get("restarted") else None
        flow = RouterFlow(
            self.config,
            cost=cost,
            initial_version=int(self.boot.options.get("initial_version", 0)),
            recovery=recovery,
            log=self.log,
        )
        self.attach(flow, serving=self.make_link(self.name, serve=True))
        self.perform(flow.start(time.monotonic()))  # the log's first router event: the ledger replay starts here
        return {}

    def _rebuild(self) -> RouterRecovery:
        events = self.logged_events()
        recovery = rebuild_router(events, LedgerSizes.from_config(self.config), launch_of(self.boot.incarnation))
        self.refuse_a_torn_log(recovery.num_missing_events)
        self.already_handled = set(recovery.seen_event_ids)
        self.log.info("rebuilt from the event log", requests=len(recovery.requests),
                      recalled=recovery.num_recalled, commands=len(recovery.commands),
                      next_buffer=recovery.ledger.next_buffer_id)  # fmt: skip
        return recovery

    @property
    def num_inflight(self) -> int:
        return self.flow.num_inflight if hasattr(self, "flow") else 0

    def step(self) -> bool:
        if not self.flow.has_work:
            return False
        effects = self.flow.route(time.monotonic())
        self.perform(effects)
        return bool(effects)

    def teardown(self) -> None:
        super().teardown()
        if hasattr(self, "flow") and self.flow.counters:
            self.log.info("router counters", **dict(self.flow.counters))
