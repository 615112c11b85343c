"""The gateway's HTTP server: FastAPI routes over a bridge (``psrl.gateway.bridge``), run by uvicorn in a thread.

Needs the ``agents`` extra (FastAPI, uvicorn); importing this module without it raises an
ImportError that says so. Routes only check and move requests; the sessions' logic runs on the
bridge's owner thread (``psrl.gateway.sessions``).
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from psrl.gateway import EXTRA_HINT

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(EXTRA_HINT) from exc

import msgspec

from psrl.gateway.api import ApiError, ChatCall, parse_chat, parse_completion
from psrl.gateway.bridge import Submitter
from psrl.gateway.replies import chat_chunks, chat_completion, completion, token_logprobs
from psrl.gateway.sessions import Answer

Endpoint = Callable[[Request], Awaitable[Response]]


class JSONResponse(Response):
    """A JSON answer encoded by msgspec: a route that returns one skips FastAPI's encoder (a third of
    a call's time in the server)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


@dataclass
class ServerSettings:
    token: str = ""  # bearer token every request must carry ("" = none: loopback only)
    max_body_bytes: int = 1 << 20
    model_names: tuple[str, ...] = ("psrl",)
    errors: Counter[int] = field(default_factory=Counter)  # answered errors by status


def make_app(bridge: Submitter, settings: ServerSettings) -> Guarded:
    app = FastAPI(
        title="psrl session gateway",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        default_response_class=JSONResponse,
    )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return _error(error, settings)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        # an unknown path or method: the OpenAI error shape too
        return _error(ApiError(error.status_code, str(error.detail)), settings)

    _session_routes(app, bridge, settings)
    direct = _openai_routes(app, bridge, settings)
    return Guarded(app, settings, direct)


class Guarded:
    """The bearer token and the body's declared size, checked before FastAPI sees the request: plain
    ASGI, so a call costs no dependency resolution (a sixth of the server's time per call).

    The completion calls (`direct`: a POST to ``/sessions/{sid}/v1/<route>``) go from here straight to
    their endpoint: routing and middleware were a quarter of a call's time in the server. Their
    errors get the same OpenAI-shaped answers as the app's handlers give."""

    def __init__(self, app: FastAPI, settings: ServerSettings, direct: dict[str, Endpoint]) -> None:
        self.app, self.settings, self.direct = app, settings, direct

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            error = _refusal(dict(scope["headers"]), self.settings)
            if error is not None:
                await _error(error, self.settings)(scope, receive, send)
                return
            endpoint, sid = self._direct(scope)
            if endpoint is not None:
                await self._serve(endpoint, sid, scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _direct(self, scope: Any) -> tuple[Endpoint | None, str]:
        if scope["method"] != "POST" or not scope["path"].startswith("/sessions/"):
            return None, ""
        sid, _, rest = scope["path"][len("/sessions/") :].partition("/")
        version, _, route = rest.partition("/")
        return (self.direct.get(route), sid) if sid and version == "v1" else (None, "")

    async def _serve(self, endpoint: Endpoint, sid: str, scope: Any, receive: Any, send: Any) -> None:
        scope["path_params"] = {"sid": sid}
        try:
            response = await endpoint(Request(scope, receive))
        except ApiError as error:
            response = _error(error, self.settings)
        await response(scope, receive, send)


def _refusal(headers: dict[bytes, bytes], settings: ServerSettings) -> ApiError | None:
    if settings.token and headers.get(b"authorization", b"") != f"Bearer {settings.token}".encode():
        return ApiError(401, "missing or wrong bearer token", code="invalid_api_key")
    try:
        declared = int(headers.get(b"content-length") or 0)
    except ValueError:
        return ApiError(400, "the content-length header is not a number")
    if declared > settings.max_body_bytes:
        return ApiError(413, f"the body is over {settings.max_body_bytes} bytes", code="body_too_large")
    return None


def _session_routes(app: FastAPI, bridge: Submitter, settings: ServerSettings) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/sessions")
    async def open_session(request: Request) -> Any:
        body = await _json(request, settings) if await _body(request) else {}
        return await bridge.submit("open", "", body)

    @app.get("/sessions/{sid}")
    async def get_session(sid: str) -> Any:
        return await bridge.submit("get", sid)

    @app.delete("/sessions/{sid}")
    async def delete_session(sid: str) -> Any:
        return await bridge.submit("delete", sid)


def _direct_post(app: FastAPI, direct: dict[str, Endpoint], route: str) -> Callable[[Endpoint], Endpoint]:
    """A POST to ``/sessions/{sid}/v1/<route>`` that `Guarded` serves itself (the app keeps the route
    too, as Starlette's, without FastAPI's parameter resolution)."""

    def register(endpoint: Endpoint) -> Endpoint:
        app.router.add_route(f"/sessions/{{sid}}/v1/{route}", endpoint, methods=["POST"])
        direct[route] = endpoint
        return endpoint

    return register


def _openai_routes(app: FastAPI, bridge: Submitter, settings: ServerSettings) -> dict[str, Endpoint]:
    """The OpenAI routes; returns the completions' endpoints by route, which `Guarded` serves directly."""
    direct: dict[str, Endpoint] = {}

    @app.get("/sessions/{sid}/v1/models")
    async def models(sid: str) -> Any:
        return {
            "object": "list",
            "data": [{"id": m, "object": "model", "owned_by": "psrl"} for m in settings.model_names],
        }

    @_direct_post(app, direct, "chat/completions")
    async def chat(request: Request) -> Response:
        sid = request.path_params["sid"]
        call = parse_chat(await _json(request, settings))
        _check_model(call.model, settings)
        answer: Answer = await bridge.submit("chat", sid, call)
        return _timed(_chat_response(f"chatcmpl-{sid}-{answer.turn}", call, answer), answer)

    @_direct_post(app, direct, "completions")
    async def complete(request: Request) -> Response:
        sid = request.path_params["sid"]
        call = parse_completion(await _json(request, settings))
        _check_model(call.model, settings)
        answer: Answer = await bridge.submit("completion", sid, call)
        model = call.model or settings.model_names[0]
        body = completion(
            f"cmpl-{sid}-{answer.turn}",
            model,
            answer.reply.message["content"] or "",
            answer.reply.finish_reason,
            answer.usage,
        )
        return _sse([body]) if call.stream else JSONResponse(body)

    return direct


def _chat_response(cid: str, call: ChatCall, answer: Answer) -> Any:
    model = call.model or "psrl"
    logprobs = token_logprobs(answer.pieces, answer.logprobs, answer.top_logprobs) if call.logprobs else None
    if call.stream:
        return _sse(chat_chunks(cid, model, answer.reply, answer.usage, logprobs))
    return JSONResponse(chat_completion(cid, model, answer.reply, answer.usage, logprobs))


def _timed(response: Response, answer: Answer) -> Response:
    """The answer with the engine's time for its turn in a header, where it was measured (the benchmark's)."""
    if answer.engine_ms:
        response.headers["x-psrl-engine-ms"] = f"{answer.engine_ms:.3f}"
    return response


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield b"data: " + msgspec.json.encode(chunk) + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def _body(request: Request) -> bytes:
    try:
        return await request.body()
    except ClientDisconnect:  # gone in the middle of its body: counted; the answer reaches no one
        gone = "the client disconnected before its body was complete"
        raise ApiError(400, gone, code="client_disconnected") from None


async def _json(request: Request, settings: ServerSettings) -> Any:
    raw = await _body(request)
    if len(raw) > settings.max_body_bytes:
        raise ApiError(413, f"the body is over {settings.max_body_bytes} bytes", code="body_too_large")
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from exc


def _check_model(model: str, settings: ServerSettings) -> None:
    if model and model not in settings.model_names:
        raise ApiError(
            404,
            f"no model {model!r} (this gateway serves {', '.join(settings.model_names)})",
            param="model",
            code="model_not_found",
        )


def _error(error: ApiError, settings: ServerSettings) -> JSONResponse:
    settings.errors[error.status] += 1
    return JSONResponse(error.body(), status_code=error.status)


class GatewayServer:
    """uvicorn serving ``app`` in a daemon thread, on a socket bound before it starts (port 0: any free one)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without it
        # Nagle holds a response's body behind its headers until the client's delayed ACK (40 ms a call)
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host, self.port = host, self.socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_keep_alive=30,
            proxy_headers=False,  # no proxy in front: its middleware would only cost every call
            server_header=False,
            date_header=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="gateway-http", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> GatewayServer:
        self.thread.start()
        import time

        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway's HTTP server did not start")
            time.sleep(0.01)
        return self

    def _run(self) -> None:
        self.server.run(sockets=[self.socket])

    def stop(self, timeout_s: float = 3.0) -> None:
        # calls still waiting (their session's turns will not come now) are not waited for
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(timeout=timeout_s)
        self.socket.close()
