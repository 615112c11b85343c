"""The session scheduler actor: ``psrl.flows.SessionFlow`` with env worker processes.

It connects to the router's link (turns in, next turns and session ends out); instance status and
exits come from the bus. Environment steps run in ``actors.env_pool.EnvPool``; their answers are
published (``session.env_step``, for the event log) and handed to the flow. The ThunderAgent tick
runs from the actor's loop.

A scheduler restarted within a launch (``restarted``) connects to the router first (from then on
the router's messages reach it), then rebuilds the sessions its predecessor left from the run's
event log (``psrl.flows.session_recovery``) and continues them; the router's messages that were
already in the log are handled there, so the link's copy of one of them is dropped.

With an agent (``agent.entry`` / ``agent.command``) the scheduler also serves the OpenAI-compatible
session gateway (``psrl.gateway``): uvicorn in a thread of this process, its calls handed to this
loop through a ``Bridge`` (a queue and a wake-up socket this loop polls), so every session decision
stays in the flow, on one thread, next to the sessions' router traffic; the env workers run the
agents. A restarted scheduler runs the agents of the sessions it rebuilt again from the start;
their calls get the sessions' logged turns back (``psrl.gateway.resume``); calls still waiting
when a scheduler stops get a retryable 503. In this process rather than an actor of its own: a
call and the session it acts on are one piece of state (one owner), and a turn costs no extra hop
on the bus.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

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
        from psrl.assets import DEMO_MODEL_DIR

        cfg = self.config
        tokenizer_dir = cfg.model.tokenizer_path or cfg.model.path or str(DEMO_MODEL_DIR)
        # the link first: the router may finish first turns while the env workers still start
        # (their steps wait in the pool's queue until a worker reports ready)
        link = self.make_link(ROUTER, serve=False)
        self.already_handled: set[str] = set()
        recovery = self._rebuild() if self.boot.options.get("restarted") else None
        agents, gateway = self._start_gateway() if cfg.agent.enabled else ("", None)
        self.pool = EnvPool(
            cfg.env,
            cfg.task.name,
            cfg.task.seed,
            tokenizer_dir,
            on_pipe=self._on_pipe,
            log=self.log,
            agents=agents,
            timeout_s=cfg.agent.timeout_s if agents else 0.0,
        )
        flow = SessionFlow(cfg, self.pool, log=self.log, gateway=gateway)
        self.attach(flow, peers={ROUTER: link})
        if recovery is not None:
            self.perform(flow.restore(recovery, time.monotonic()))
        return {"env_workers": cfg.env.num_workers}

    def _start_gateway(self) -> tuple[str, Any]:
        """Serve the session gateway; the agent workers' spec and the gateway's sessions."""
        from psrl.gateway.bridge import Bridge
        from psrl.gateway.server import GatewayServer, ServerSettings, make_app
        from psrl.gateway.setup import build_gateway, local_url, run_token, worker_spec

        settings = self.config.agent.gateway
        token = run_token(settings.host, settings.token)
        self.bridge, self.jobs = Bridge(), dict[int, Any]()
        self.http_settings = ServerSettings(token, settings.max_body_bytes, (settings.model_name,))
        self.http = GatewayServer(make_app(self.bridge, self.http_settings), settings.host, settings.port).start()
        self.add_input(self.bridge.fileno(), self._gateway_jobs)
        url = local_url(settings.host, self.http.port)
        self.log.info("session gateway serving", url=self.http.url, token_required=bool(token))
        return worker_spec(self.config, url, token), build_gateway(self.config)

    def _gateway_jobs(self) -> None:
        now = time.monotonic()
        for job in self.bridge.take():
            self.jobs[job.job_id] = job
            self.flow.gateway_job(job.job_id, job.op, job.session_id, job.payload, now)
            self.perform(self.flow.take())

    def perform(self, effects: Any) -> None:
        super().perform(effects)
        if hasattr(self, "flow") and self.flow.answers:  # answers of gateway calls, back to the HTTP thread
            answers, self.flow.answers = self.flow.answers, []
            for job_id, result in answers:
                job = self.jobs.pop(job_id, None)
                if job is not None and isinstance(result, Exception):
                    job.fail(result)
                elif job is not None:
                    job.resolve(result)

    def _refuse_waiting_calls(self) -> None:
        """Calls still waiting when the scheduler stops get a retryable 503 (the OpenAI SDK retries it)."""
        from psrl.gateway.api import ApiError

        stopping = ApiError(503, "the session scheduler is stopping; retry", code="scheduler_stopping")
        for job in [*self.jobs.values(), *self.bridge.take()]:
            job.fail(stopping)
        self.jobs.clear()

    def _rebuild(self) -> SessionRecovery:
        recovery = rebuild_sessions(self.logged_events(), launch_of(self.boot.incarnation))
        self.refuse_a_torn_log(recovery.num_missing_events)
        self.already_handled = set(recovery.seen_event_ids)
        self.log.info(
            "rebuilt from the event log",
            sessions=len(recovery.sessions),
            answered=recovery.num_answered,
            rerun=recovery.num_rerun,
        )
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
        for reply in replies:
            done = msgspec.structs.replace(reply, turn=self.flow.agent_turn(reply.request_id, reply.turn))
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
            self.pool.close()  # agents first: their open calls end with them
        if hasattr(self, "http"):
            self._refuse_waiting_calls()
            self.http.stop()
            errors = {f"http_{status}": n for status, n in sorted(self.http_settings.errors.items())}
            self.log.info("gateway errors", **errors)  # every refused call, by status
        if hasattr(self, "flow") and self.flow.counters:
            self.log.info("session counters", **dict(self.flow.counters))
