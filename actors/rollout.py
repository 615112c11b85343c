"""A rollout instance: ``psrl.flows.InstanceFlow`` around one engine (``engine.backend``: embedded or vLLM).

It connects to the router's link; sync and migration commands and published versions come from
the bus. Weights come from the parameter server (``psrl.ps.supply``). The loop steps the engine
between batches of messages.
"""

from __future__ import annotations

import time

from typing import Any

from actors.base import Inputs
from actors.flow_actor import FlowActor
from actors.memory_control import MemoryControl
from psrl.engine import Engine, build_engine
from psrl.flows.instance import ROUTER, InstanceFlow
from psrl.ps.from_config import make_puller
from psrl.ps.supply import PsWeightSupply


class RolloutActor(FlowActor):
    ROLE = "rollout"
    FLOW = InstanceFlow
    flow: InstanceFlow

    def inputs(self) -> Inputs:
        inputs = super().inputs()
        self.memory_control = MemoryControl(self.name, self._release, self._restore, self.publisher.publish, log=self.log)
        if not self.config.topology.colocate:
            return inputs
        return Inputs(bus={**inputs.bus, **self.memory_control.handlers()}, link=inputs.link, fatal=inputs.fatal)

    def setup(self) -> dict[str, int]:
        engine = build_engine(self.config)
        if self.config.topology.colocate and not isinstance(engine, Engine):  # the config rules refuse it first
            raise TypeError("colocated rollout needs the embedded engine (engine.backend=embedded)")
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
        if self.memory_control.is_paused:  # nothing runs on the GPU until the coordinator resumes the instance
            return False
        effects = self.flow.step(time.monotonic())
        self.perform(effects)
        return bool(effects) or self.flow.engine.has_unfinished_requests()

    def _release(self) -> Any:
        return self._engine().release_memory()

    def _restore(self) -> Any:
        return self._engine().restore_memory()

    def _engine(self) -> Engine:
        engine = self.flow.engine
        if not isinstance(engine, Engine):
            raise TypeError("memory release needs the embedded engine")
        return engine

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
