"""Request bodies of the OpenAI API as the gateway takes them, and its errors.

Errors carry OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``) and the status a
client expects: 400 bad input, 401 no or wrong bearer token, 404 unknown session or model, 409 a
session that is ending or a conversation it cannot continue, 413 a body or prompt too large, 429
a second call on a session while one is in flight, 503 the gateway not serving yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psrl.gateway.messages import MessageError, normalize, normalize_tools

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatCall:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    use_tools: bool = True  # tool_choice none: the model's reply is never parsed into tool calls
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None  # recorded; the run's sampling decides (training needs its log-probs)
    top_p: float | None = None
    logprobs: bool = False
    stream: bool = False
    model: str = ""
    top_logprobs: int = 0  # alternatives per generated token (needs logprobs)


@dataclass(frozen=True)
class CompletionCall:
    prompt: str
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    model: str = ""


def parse_chat(body: Any) -> ChatCall:
    body = _object(body)
    try:
        messages, tools = normalize(body.get("messages")), normalize_tools(body.get("tools"))
    except MessageError as exc:
        raise ApiError(400, str(exc), param="messages") from exc
    choice = body.get("tool_choice", "auto")
    if not (choice in ("auto", "none", "required") or isinstance(choice, dict)):
        raise ApiError(400, "'tool_choice' must be auto, none, required or a function", param="tool_choice")
    return ChatCall(
        messages,
        tools,
        choice != "none",
        _max_tokens(body),
        _stop(body),
        _number(body, "temperature", 0, 2),
        _number(body, "top_p", 0, 1),
        bool(body.get("logprobs")),
        bool(body.get("stream")),
        str(body.get("model", "")),
        _top_logprobs(body),
    )


def _top_logprobs(body: dict[str, Any]) -> int:
    value = body.get("top_logprobs")
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 20:
        raise ApiError(400, "'top_logprobs' must be an integer in [0, 20]", param="top_logprobs")
    if value and not body.get("logprobs"):
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return value


def parse_completion(body: Any) -> CompletionCall:
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", param="prompt")
    _number(body, "temperature", 0, 2)
    return CompletionCall(prompt, _max_tokens(body), _stop(body), bool(body.get("stream")), str(body.get("model", "")))


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("n", 1) != 1:
        raise ApiError(400, "only n=1 is supported (a session is one trajectory)", param="n")
    return body


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, "'max_tokens' must be a positive integer", param="max_tokens")
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "'stop' must be a string or up to 4 strings", param="stop")
    return list(stops)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ApiError(400, f"'{name}' must be a number in [{low:g}, {high:g}]", param=name)
    return float(value)
