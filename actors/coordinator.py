"""The coordinator actor: ``psrl.flows.CoordinatorFlow`` with the task's prompts and rewards.

It connects to the router's link and to each trainer rank's; instance, weight and trainer events
come from the bus. The flow's tick (sync and migration decisions) runs from the actor's loop.
"""

from __future__ import annotations

import time

from actors.flow_actor import FlowActor
from psrl.evaluation.planner import EvalPlanner
from psrl.flows.coordinator import ROUTER, CoordinatorFlow
from psrl.flows.prompts import TaskPrompts
from psrl.routing.cost_model import load_cost_model


class CoordinatorActor(FlowActor):
    ROLE = "coordinator"
    FLOW = CoordinatorFlow
    flow: CoordinatorFlow

    def setup(self) -> dict[str, int]:
        cfg = self.config
        routing = cfg.psrl.rollout_coordination.routing_strategy
        cost = load_cost_model(routing.cost_model_path) if routing.cost_model_path else None
        self.task = TaskPrompts(cfg)
        self.held_out = self.task.held_out(cfg) if cfg.trainer.eval_interval else None
        options = self.boot.options
        first_prompt_id = options.get("first_prompt_id")
        flow = CoordinatorFlow(
            cfg,
            self.task,
            self.task,
            cost=cost,
            initial_version=int(options.get("initial_version", 0)),
            first_prompt_id=None if first_prompt_id is None else int(first_prompt_id),
            evaluation=None if self.held_out is None else EvalPlanner(cfg, self.held_out),
            log=self.log,
        )
        peers = [ROUTER, *flow.trainers]
        self.attach(flow, peers={peer: self.make_link(peer, serve=False) for peer in peers})
        self.perform(flow.start(time.monotonic()))
        return {}

    def teardown(self) -> None:
        if hasattr(self, "task"):
            self.task.close()
        if getattr(self, "held_out", None) is not None:
            self.held_out.close()
        super().teardown()
