"""A turn's generated tokens as the OpenAI answer: text, stop strings, tool calls, log-probs, usage."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from bus.messages import FinishReason
from psrl.gateway.tool_calls import Parsed, parse


@dataclass(frozen=True)
class Reply:
    message: dict[str, Any]  # the assistant message as the client gets it (OpenAI shape)
    canonical: dict[str, Any]  # the same message as history matching compares it
    finish_reason: str  # stop, length or tool_calls
    malformed_tool_call: bool = False


def make_reply(text: str, finish: str, parser: str, stop: list[str], call_id: str) -> Reply:
    """``text``: the turn decoded without special tokens; ``finish``: the engine's (stop or length)."""
    cut = _cut(text, stop)
    if cut is not None:
        text, finish = cut, "stop"
    parsed: Parsed = parse(parser, text)
    calls: list[dict[str, Any]] = [
        {"id": f"{call_id}-{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for i, c in enumerate(parsed.tool_calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content if parsed.content or not calls else None}
    if calls:
        message["tool_calls"] = calls
        finish = "tool_calls" if finish == "stop" else finish
    canonical: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if calls:
        canonical["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])},
            }
            for c in calls
        ]
    return Reply(message, canonical, finish, parsed.malformed)


def finish_name(reason: int) -> str:
    """The engine's finish reason (``bus.messages.FinishReason``) as OpenAI names it."""
    return "length" if reason in (FinishReason.LENGTH, FinishReason.TRUNCATED) else "stop"


def _cut(text: str, stop: list[str]) -> str | None:
    """``text`` up to the first stop string (not included), or None when none occurs."""
    found = [text.index(s) for s in stop if s and s in text]
    return text[: min(found)] if found else None


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(cid: str, model: str, reply: Reply, use: dict[str, int], logprobs: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": reply.message, "finish_reason": reply.finish_reason, "logprobs": logprobs}
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": use,
    }


def chat_chunks(cid: str, model: str, reply: Reply, use: dict[str, int], logprobs: Any = None) -> list[dict[str, Any]]:
    """The answer as stream chunks: the role, the content (with the tokens' log-probs), each tool call,
    the finish, the usage."""
    head = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if reply.message.get("content"):
        deltas.append({"content": reply.message["content"]})
    for i, call in enumerate(reply.message.get("tool_calls", [])):
        deltas.append({"tool_calls": [{"index": i, **call}]})
    chunks: list[dict[str, Any]] = []
    for number, delta in enumerate(deltas):
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
        if logprobs is not None and number == len(deltas) - 1:  # the whole turn's, once
            choice["logprobs"] = logprobs
        chunks.append({**head, "choices": [choice]})
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
    chunks.append({**head, "choices": [], "usage": use})
    return chunks


def completion(cid: str, model: str, text: str, finish: str, use: dict[str, int]) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return {
        "id": cid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": use,
    }


def token_logprobs(
    pieces: list[str], logprobs: list[float], top: list[list[tuple[str, float]]] | None = None
) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: each generated token's text, log-prob and likeliest alternatives."""
    alternatives = top or [[] for _ in pieces]
    return {
        "content": [
            {
                "token": t,
                "logprob": float(lp),
                "bytes": list(t.encode()),
                "top_logprobs": [{"token": a, "logprob": float(alp), "bytes": list(a.encode())} for a, alp in alts],
            }
            for t, lp, alts in zip(pieces, logprobs, alternatives, strict=True)
        ],
        "refusal": None,
    }
