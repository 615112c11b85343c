"""A rollout instance: ``psrl.flows.InstanceFlow`` around one engine (``engine.backend``: embedded or vLLM).

It connects to the router's link; sync and migration commands and published versions come from
the bus. Weights come from the parameter server (``psrl.ps.supply``). The loop steps the engine
between batches of messages.
"""

from __future__ import annotations

import time

from actors.flow_actor import FlowActor
from psrl.config import Config
from psrl.engine import build_engine
from psrl.engine.args import EngineArgs
from psrl.engine.protocol import RolloutEngine
from psrl.flows.instance import ROUTER, InstanceFlow
from psrl.flows.instance_kv import KvPort
from psrl.launches import is_replacement
from psrl.ps.from_config import make_puller
from psrl.ps.landing import DeviceLanding
from psrl.ps.supply import PsWeightSupply


class RolloutActor(FlowActor):
    ROLE = "rollout"
    WARM_IMPORTS = (*FlowActor.WARM_IMPORTS, "torch", "safetensors", "psrl.engine.engine", "psrl.models.llama",
                    "psrl.models.loader", "psrl.kvcache.transfer")  # fmt: skip
    FLOW = InstanceFlow
    flow: InstanceFlow

    def setup(self) -> dict[str, int]:
        engine = build_engine(self.config)
        # vLLM's exit-time finalizers take 10-30 s on 2 busy cores; teardown below releases what matters
        self.exit_without_interpreter_teardown = self.config.engine.backend == "vllm"
        ps = self.config.psrl.ps
        device = EngineArgs.from_config(self.config).resolve_device()
        puller = make_puller(
            self.config,
            [self.boot.endpoint(f"ps-{i}.1") for i in range(self.config.topology.n_ps_shards)],
            curve=self.bus.options.curve,
            pin_memory=device.type == "cuda",
        )
        puller.on_retry = self.report_pull_retry
        embedded_on_gpu = device.type == "cuda" and self.config.engine.backend == "embedded"
        # colocated, the instance gives its GPU memory to the trainer while versions arrive: they stay on the host
        lands = ps.prefetch_to_device is not False and embedded_on_gpu and not self.config.topology.colocate
        landing = DeviceLanding(device, ps.prefetch_to_device) if lands else None
        self.weights = PsWeightSupply(puller, pull_attempts=ps.pull_attempts, prefetch=ps.prefetch, landing=landing)
        self.kv = kv_port(self.config, engine)
        flow = InstanceFlow(self.name, self.config, engine, self.weights, log=self.log, kv=self.kv)
        self.attach(flow, peers={ROUTER: self.make_link(ROUTER, serve=False)})
        # a replacement, or an instance added to a running run (psrl scale): the run is ahead of the initial weights
        joins = is_replacement(self.boot.incarnation) or bool(self.boot.options.get("joins_running"))
        committed = self.weights.puller.latest_version() if joins else -1
        self.perform(flow.start(time.monotonic(), committed_version=committed))
        return {"kv_blocks": engine.status().num_kv_blocks_total, "max_num_seqs": self.config.engine.max_num_seqs}

    @property
    def num_inflight(self) -> int:
        return self.flow.num_inflight if hasattr(self, "flow") else 0

    def step(self) -> bool:
        effects = self.flow.step(time.monotonic())
        self.perform(effects)
        return bool(effects) or self.flow.has_work

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
        kv = getattr(self, "kv", None)
        if kv is not None:
            kv.close()


def kv_port(config: Config, engine: RolloutEngine) -> KvPort | None:
    """The engine's offload tier, with a KV server and fetcher when KV transfer is on (psrl.lmcache)."""
    tier = getattr(engine, "kv_tier", None)
    if tier is None:
        return None
    if not config.psrl.rollout_coordination.routing_strategy.kv_transfer.enable:
        return KvPort(tier)
    from psrl.kvcache.transfer import KvFetcher, KvServer

    return KvPort(tier, KvServer(tier), KvFetcher(tier, config.psrl.lmcache.p2p_transfer_channel))
