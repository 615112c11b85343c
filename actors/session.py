"""The session scheduler actor: ``psrl.flows.SessionFlow`` with env worker processes.

It connects to the router's link (turns in, next turns and session ends out); instance status and
exits come from the bus. Environment steps run in ``actors.env_pool.EnvPool``; their answers are
published (``session.env_step``, for the event log) and handed to the flow. The ThunderAgent tick
runs from the actor's loop.

A scheduler restarted within a launch (``restarted``) connects to the router first (from then on
the router's messages reach it), then rebuilds the sessions its predecessor left from the run's
event log (``psrl.flows.session_recovery``) and continues them; the router's messages that were
already in the log are handled there, so the link's copy of one of them is dropped.
"""

from __future__ import annotations

import time
from typing import Any

from actors.env_pool import EnvPool
from actors.flow_actor import FlowActor
from psrl.flows.session import ROUTER, SessionFlow
from psrl.flows.session_recovery import SessionRecovery, rebuild_sessions
from psrl.launches import launch_of


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
        self.already_handled: set[str] = set()
        recovery = self._rebuild() if self.boot.options.get("restarted") else None
        self.pool = EnvPool(cfg.env, cfg.task.name, cfg.task.seed, tokenizer_dir, on_pipe=self._on_pipe, log=self.log)
        flow = SessionFlow(cfg, self.pool, log=self.log)
        self.attach(flow, peers={ROUTER: link})
        if recovery is not None:
            self.perform(flow.restore(recovery, time.monotonic()))
        return {"env_workers": cfg.env.num_workers}

    def _rebuild(self) -> SessionRecovery:
        recovery = rebuild_sessions(self.logged_events(), launch_of(self.boot.incarnation))
        self.refuse_a_torn_log(recovery.num_missing_events)
        self.already_handled = set(recovery.seen_event_ids)
        self.log.info("rebuilt from the event log", sessions=len(recovery.sessions),
                      answered=recovery.num_answered, rerun=recovery.num_rerun)  # fmt: skip
        return recovery

    def _on_pipe(self, connection: Any, added: bool) -> None:
        if added:
            self.add_input(connection.fileno(), self._collect)
        else:
            self.remove_input(connection.fileno())

    def _collect(self) -> None:
        replies = self.pool.poll()
        for ready in self.pool.take_readies():
            self.publisher.publish(ready)
        for done in replies:
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
