"""The gateway over an embedded engine (tests, ``tools/bench_gateway.py``, trying an agent out).
A run's gateway lives in the session scheduler instead and generates through the router
(``actors.session``).

The sessions (TITO, replies) are handled on uvicorn's event loop as calls come (an
``InlineBridge``: their work is a fraction of a millisecond and never blocks), and the engine's
finished turns are read there too (its ``fileno``), so a call crosses no thread. The engine steps
apart (``psrl.gateway.engine_backends``: a thread, or a process of its own), so that a call is
handed to it at once rather than after the step in progress (which, prefilling 64 sessions' turns,
takes tens of milliseconds). A turn's engine time (``x-psrl-engine-ms``) is the engine's own request
latency: from the hand-off to its input queue to its result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

from psrl.gateway.api import ApiError, ChatCall, CompletionCall
from psrl.gateway.bridge import InlineBridge, Job
from psrl.gateway.chat_templates import ChatTemplate, load_template
from psrl.gateway.codec import Codec, load_codec
from psrl.gateway.engine_backends import EngineSpec, Finished, ProcessEngine, ThreadEngine
from psrl.gateway.replies import finish_name
from psrl.gateway.server import GatewayServer, ServerSettings, make_app
from psrl.gateway.sessions import Answer, Gateway, Settings
from psrl.gateway.tito import TitoSession


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
        engine_process: bool = False,  # the engine in a child process (the benchmark) or on a thread
        torch_threads: int = 0,
        engine_niceness: int = 0,
        num_logprobs: int = 0,  # alternatives the engine returns per token (top_logprobs up to this)
        engine: dict[str, Any] | None = None,  # more EngineArgs (the benchmark's KV room)
    ) -> None:
        chat = load_template(model_dir, template)
        self.codec = load_codec(model_dir)
        spec = EngineSpec(
            model_dir,
            seed,
            temperature,
            tuple(self.codec.stop_ids(_close(chat, self.codec), chat.eos_token)),
            num_logprobs,
            torch_threads,
            engine_niceness,
            tuple(sorted((engine or {}).items())),
        )
        self.engine: ThreadEngine | ProcessEngine = ProcessEngine(spec) if engine_process else ThreadEngine(spec)
        settings = dataclasses.replace(
            settings or Settings(), context_tokens=self.engine.max_model_len, max_top_logprobs=num_logprobs
        )
        self.gateway = Gateway(chat, self.codec.encode, self.codec.decode, self.codec.text, settings)
        self.bridge = InlineBridge(self._handle, self._watch_engine)
        self.http_settings = server or ServerSettings()  # its error counts too
        self.server = GatewayServer(make_app(self.bridge, self.http_settings))
        self.waiting: dict[str, Job] = {}
        self.prompts: dict[str, list[int]] = {}
        self.generations: list[tuple[list[int], list[int]]] = []  # (prompt, output) of every turn, in order
        self._ids = itertools.count()

    def __enter__(self) -> EngineGateway:
        self.engine.start()
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self.engine.stop()

    @property
    def url(self) -> str:
        return self.server.url

    def _watch_engine(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_reader(self.engine.fileno(), self._engine_results)

    def _engine_results(self) -> None:
        for result in self.engine.results():
            self._finish(result)

    def _finish(self, result: Finished) -> None:
        job = self.waiting.pop(result.request_id, None)
        if job is None:  # deleted while the engine finished it
            return
        self.generations.append((self.prompts.pop(result.request_id), list(result.output_ids)))
        finish = finish_name(result.finish_reason)
        try:
            answer = self.gateway.generated(
                job.session_id, result.output_ids, finish, result.logprobs, result.top_logprobs
            )
            job.resolve(dataclasses.replace(answer, engine_ms=result.engine_ms))
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
        self.waiting[job.session_id] = job
        self.prompts[job.session_id] = outcome.plan.prompt
        self.engine.submit(job.session_id, outcome.plan.prompt, outcome.max_tokens)

    def _delete(self, sid: str) -> dict[str, Any]:
        if sid in self.waiting:
            self.engine.abort(sid)
            job = self.waiting.pop(sid)
            self.gateway.failed(sid)
            job.fail(ApiError(409, f"session {sid} was deleted while its call ran", code="session_closing"))
        if not self.gateway.close(sid):
            raise ApiError(404, f"no session {sid}", code="session_not_found")
        record = self.gateway.record(sid)
        self.gateway.forget(sid)
        return {"id": sid, "object": "session.deleted", "deleted": True, "record": record}


def _close(chat: ChatTemplate, codec: Codec) -> str:
    return TitoSession("", chat, codec.encode, codec.decode).close()
