"""The session scheduler actor: ``psrl.flows.SessionFlow`` with env worker processes.

It connects to the router's link (turns in, next turns and session ends out); instance status and
exits come from the bus. Environment steps run in ``actors.env_pool.EnvPool``; their answers are
published (``session.env_step``, for the event log) and handed to the flow. The ThunderAgent tick
runs from the actor's loop.
"""

from __future__ import annotations

import time
from typing import Any

from actors.env_pool import EnvPool
from actors.flow_actor import FlowActor
from psrl.flows.session import ROUTER, SessionFlow


class SessionActor(FlowActor):
    ROLE = "session"
    WARM_IMPORTS = (*FlowActor.WARM_IMPORTS, "multiprocessing", "psrl.envs.registry")
    FLOW = SessionFlow
    flow: SessionFlow

    def setup(self) -> dict[str, int]:
        from psrl.engine.args import DEMO_MODEL_DIR

        cfg = self.config
        tokenizer_dir = cfg.model.tokenizer_path or cfg.model.path or str(DEMO_MODEL_DIR)
        # the link first: the router may finish first turns while the env workers still start
        # (their steps wait in the pool's queue until a worker reports ready)
        link = self.make_link(ROUTER, serve=False)
        self.pool = EnvPool(cfg.env, cfg.task.name, cfg.task.seed, tokenizer_dir, on_pipe=self._on_pipe, log=self.log)
        flow = SessionFlow(cfg, self.pool, log=self.log)
        self.attach(flow, peers={ROUTER: link})
        return {"env_workers": cfg.env.num_workers}

    def _on_pipe(self, connection: Any, added: bool) -> None:
        if added:
            self.add_input(connection.fileno(), self._collect)
        else:
            self.remove_input(connection.fileno())

    def _collect(self) -> None:
        for done in self.pool.poll():
            self.publisher.publish(done, request_id=done.request_id)
            self.perform(self.flow.handle(done, time.monotonic()))

    @property
    def num_inflight(self) -> int:
        return self.flow.num_inflight if hasattr(self, "flow") else 0

    def step(self) -> bool:
        if hasattr(self, "pool") and self.pool.num_running:
            self._collect()  # timeouts and dead workers show up without pipe traffic
        return False

    def teardown(self) -> None:
        super().teardown()
        if hasattr(self, "pool"):
            self.pool.close()
        if hasattr(self, "flow") and self.flow.counters:
            self.log.info("session counters", **dict(self.flow.counters))
