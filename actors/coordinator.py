"""The coordinator actor: ``psrl.flows.CoordinatorFlow`` with the task's prompts and rewards.

It connects to the router's link and to each trainer rank's; instance, weight and trainer events
come from the bus. The flow's tick (sync and migration decisions) runs from the actor's loop.

A coordinator restarted within a launch (``restarted``) re-runs its flow on the launch's logged
inputs and does what its predecessor had not done yet (``psrl.flows.coordinator_recovery``); the
router's messages it took from the log are dropped when its link delivers them too.

A resumed run's trainer pushes its checkpoint's version as it starts, and the coordinator dispatches
nothing until that version is published. When the publication came before the coordinator had
subscribed (the trainer's process started first, or the coordinator's was slow), the bus never brings
it; the event log holds it, so until then the coordinator looks for it there, in this launch's segments.
"""

from __future__ import annotations

import time

from actors.flow_actor import FlowActor
from bus.eventlog.reader import EventLogReader
from bus.messages import WeightsPublished
from psrl.engine_cost.model import load_cost_model
from psrl.evaluation.planner import EvalPlanner
from psrl.flows.coordinator import ROUTER, CoordinatorFlow
from psrl.flows.coordinator_recovery import replay_coordinator
from psrl.flows.prompts import TaskPrompts
from psrl.launches import launch_of

FIRST_VERSION_LOOKUP_S = 0.5  # how often a coordinator waiting for its launch's first version reads the log


class CoordinatorActor(FlowActor):
    ROLE = "coordinator"
    # its task's tokenizer: transformers' AutoTokenizer loads torch and the model registry
    WARM_IMPORTS = (*FlowActor.WARM_IMPORTS, "torch", "transformers", "transformers.models.auto.tokenization_auto",
                    "psrl.engine", "psrl.data.prompts", "psrl.rewards.factory")  # fmt: skip
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
        if options.get("restarted"):
            self._recover(flow)
        else:
            self.perform(flow.start(time.monotonic()))
            if flow.awaits_first_version and self.boot.run_dir is not None:
                self.launch_segment = int(options.get("log_segment", 0))  # where this launch's log begins
                self.every(FIRST_VERSION_LOOKUP_S, self._look_up_first_version)
        return {}

    def _look_up_first_version(self) -> None:
        """The launch's first published version from the event log, when the bus did not bring it."""
        if not self.flow.awaits_first_version:
            return
        launch = launch_of(self.boot.incarnation)
        reader = EventLogReader(self.events_dir)
        published = [
            logged.event
            for logged in reader.events_of({WeightsPublished.KIND}, first_segment=self.launch_segment)
            if launch_of(logged.event.envelope.incarnation) == launch
        ]
        if published:
            self.log.info("first version found in the event log", version=published[-1].message.version)
            self.to_flow(published[-1])

    def _recover(self, flow: CoordinatorFlow) -> None:
        events = self.logged_events()
        recovery = replay_coordinator(flow, events, launch_of(self.boot.incarnation), time.monotonic())
        self.refuse_a_torn_log(recovery.num_missing_events)
        self.already_handled = recovery.seen_event_ids
        self.log.warning("coordinator restarted: state re-run from the event log", inputs=recovery.num_inputs,
                         effects=len(recovery.effects), resent_chunks=recovery.num_resent_chunks,
                         next_prompt_id=flow.book.next_prompt_id, open_groups=len(flow.book.groups))  # fmt: skip
        self.perform(recovery.effects)

    def teardown(self) -> None:
        if hasattr(self, "task"):
            self.task.close()
        held_out = getattr(self, "held_out", None)
        if held_out is not None:
            held_out.close()
        super().teardown()
