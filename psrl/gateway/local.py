"""The gateway over an engine in this process: its own thread runs the sessions and the embedded
engine (tests, ``tools/bench_gateway.py``, trying an agent out). A run's gateway lives in the session
scheduler instead and generates through the router (``actors.session``)."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable
from typing import Any

from psrl.gateway.api import ApiError, ChatCall, CompletionCall
from psrl.gateway.bridge import Bridge, Job
from psrl.gateway.chat_templates import load_template
from psrl.gateway.codec import load_codec
from psrl.gateway.replies import finish_name
from psrl.gateway.server import GatewayServer, ServerSettings, make_app
from psrl.gateway.sessions import Answer, Gateway, Order, Settings


class EngineGateway:
    def __init__(
        self,
        model_dir: str,
        *,
        template: str = "auto",
        settings: Settings | None = None,
        server: ServerSettings | None = None,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> None:
        from psrl.engine import Engine, EngineArgs, SamplingParams

        chat = load_template(model_dir, template)
        self.codec = load_codec(model_dir)
        self.engine = Engine(EngineArgs(model_path=model_dir, seed=seed, cpu_kernels="off"))
        settings = dataclasses.replace(settings or Settings(), context_tokens=self.engine.max_model_len)
        self.gateway = Gateway(chat, self.codec.encode, self.codec.decode, self.codec.text, settings)
        stop = tuple(self.codec.stop_ids(_close(self.gateway), chat.eos_token))
        self.sampling: Callable[[int], Any] = lambda n: SamplingParams(
            max_tokens=n, temperature=temperature, stop_token_ids=stop
        )
        self.bridge = Bridge()
        self.http_settings = server or ServerSettings()  # its error counts too
        self.server = GatewayServer(make_app(self.bridge, self.http_settings))
        self.waiting: dict[str, tuple[Job, Order]] = {}
        self.engine_ms: dict[str, float] = {}  # per session: engine time of its turn (x-psrl-engine-ms)
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gateway-engine", daemon=True)

    def __enter__(self) -> EngineGateway:
        self.server.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.server.stop()
        self.bridge.close()

    @property
    def url(self) -> str:
        return self.server.url

    def _loop(self) -> None:
        import time

        while not self._stop.is_set():
            for job in self.bridge.take():
                self._handle(job)
            if not self.waiting:
                self.bridge.wait(0.05)
                continue
            started = time.perf_counter()
            out = self.engine.step()
            spent = (time.perf_counter() - started) * 1000
            for sid in self.waiting:
                self.engine_ms[sid] = self.engine_ms.get(sid, 0.0) + spent
            for result in out.finished:
                self._finish(result)

    def _finish(self, result: Any) -> None:
        job, _order = self.waiting.pop(result.request_id)
        finish = finish_name(result.finish_reason)
        try:
            answer = self.gateway.generated(job.session_id, list(result.output_ids), finish, list(result.logprobs))
            job.resolve(dataclasses.replace(answer, engine_ms=self.engine_ms.get(job.session_id, 0.0)))
        except ApiError as error:
            job.fail(error)

    def _handle(self, job: Job) -> None:
        try:
            if job.op == "open":
                body = job.payload or {}
                sid = str(body.get("id") or body.get("request_id") or f"s{next(self._ids)}")
                self.gateway.open(sid)
                job.resolve({"id": sid, "object": "session"})
            elif job.op in ("chat", "completion"):
                self._call(job)
            elif job.op == "get":
                job.resolve(self.gateway.record(job.session_id))
            elif job.op == "delete":
                job.resolve(self._delete(job.session_id))
            else:
                raise ApiError(404, f"unknown operation {job.op}")
        except ApiError as error:
            job.fail(error)

    def _call(self, job: Job) -> None:
        call: ChatCall | CompletionCall = job.payload
        outcome = self.gateway.call(job.session_id, call)
        if isinstance(outcome, Answer):
            job.resolve(outcome)
            return
        self.engine_ms[job.session_id] = 0.0
        self.waiting[job.session_id] = (job, outcome)
        self.engine.add_request(job.session_id, outcome.plan.prompt, self.sampling(outcome.max_tokens))

    def _delete(self, sid: str) -> dict[str, Any]:
        if sid in self.waiting:
            self.engine.abort(sid)
            job, _ = self.waiting.pop(sid)
            self.gateway.failed(sid)
            job.fail(ApiError(409, f"session {sid} was deleted while its call ran", code="session_closing"))
        if not self.gateway.close(sid):
            raise ApiError(404, f"no session {sid}", code="session_not_found")
        record = self.gateway.record(sid)
        self.gateway.forget(sid)
        return {"id": sid, "object": "session.deleted", "deleted": True, "record": record}


def _close(gateway: Gateway) -> str:
    from psrl.gateway.tito import TitoSession

    return TitoSession("", gateway.template, gateway.encode, gateway.decode).close()
