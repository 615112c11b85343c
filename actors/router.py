"""The router actor: ``psrl.flows.RouterFlow`` on the router's link, routing between handled messages.

Instances and the coordinator connect to the router's link (it serves a ROUTER socket); sync and
instance events come from the bus. The loop routes queued requests between batches of messages.
"""

from __future__ import annotations

import time

from actors.flow_actor import FlowActor
from psrl.flows.router import RouterFlow
from psrl.routing.cost_model import load_cost_model


class RouterActor(FlowActor):
    ROLE = "router"
    SERVES_REQUESTS = True
    FLOW = RouterFlow
    flow: RouterFlow

    def setup(self) -> dict[str, int]:
        routing = self.config.psrl.rollout_coordination.routing_strategy
        cost = load_cost_model(routing.cost_model_path) if routing.cost_model_path else None
        flow = RouterFlow(
            self.config, cost=cost, initial_version=int(self.boot.options.get("initial_version", 0)), log=self.log
        )
        self.attach(flow, serving=self.make_link(self.name, serve=True))
        self.perform(flow.start(time.monotonic()))  # the log's first router event: the ledger replay starts here
        return {}

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
