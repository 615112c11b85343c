"""A rollout instance: ``psrl.flows.InstanceFlow`` around one engine (``engine.backend``: embedded or vLLM).

It connects to the router's link; sync and migration commands and published versions come from
the bus. Weights come from the parameter server (``psrl.ps.supply``). The loop steps the engine
between batches of messages.
"""

from __future__ import annotations

import time

from actors.flow_actor import FlowActor
from psrl.engine import build_engine
from psrl.flows.instance import ROUTER, InstanceFlow
from psrl.ps.from_config import make_puller
from psrl.ps.supply import PsWeightSupply


class RolloutActor(FlowActor):
    ROLE = "rollout"
    FLOW = InstanceFlow
    flow: InstanceFlow

    def setup(self) -> dict[str, int]:
        engine = build_engine(self.config)
        # vLLM's exit-time finalizers take 10-30 s on 2 busy cores; teardown below releases what matters
        self.exit_without_interpreter_teardown = self.config.engine.backend == "vllm"
        ps = self.config.psrl.ps
        puller = make_puller(
            self.config, [self.boot.endpoint(f"ps-{i}.1") for i in range(self.config.topology.n_ps_shards)]
        )
        self.weights = PsWeightSupply(puller, pull_attempts=ps.pull_attempts, prefetch=ps.prefetch)
        flow = InstanceFlow(self.name, self.config, engine, self.weights, log=self.log)
        self.attach(flow, peers={ROUTER: self.make_link(ROUTER, serve=False)})
        self.perform(flow.start(time.monotonic()))
        return {"kv_blocks": engine.status().num_kv_blocks_total, "max_num_seqs": self.config.engine.max_num_seqs}

    @property
    def num_inflight(self) -> int:
        return self.flow.num_inflight if hasattr(self, "flow") else 0

    def step(self) -> bool:
        effects = self.flow.step(time.monotonic())
        self.perform(effects)
        is_released = self.flow.memory.is_paused  # colocation: nothing to step until resumed
        return bool(effects) or (not is_released and self.flow.engine.has_unfinished_requests())

    def on_pause(self) -> None:
        self.flow.engine.pause()

    def on_resume(self) -> None:
        self.flow.engine.resume()

    def teardown(self) -> None:
        if hasattr(self, "flow"):
            self.perform(self.flow.stop())
        super().teardown()
        if hasattr(self, "weights"):
            self.weights.close()
