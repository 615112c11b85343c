"""OpenAI chat messages in one canonical form: what templates render and what history matching compares.

Content parts are joined into text; ``None`` content is empty text; tool-call arguments (JSON text
on the wire) become objects, as chat templates expect; tool-call ids are kept for the client but
ignored when comparing, so a client that re-numbers its calls still continues its trajectory.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")


class MessageError(ValueError):
    """A message the gateway cannot take (the client gets 400 with this text)."""


def normalize(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise MessageError("'messages' must be a non-empty list")
    return [_one(i, m) for i, m in enumerate(messages)]


def _one(index: int, message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise MessageError(f"messages[{index}] is not an object")
    role = message.get("role")
    if role not in ROLES:
        raise MessageError(f"messages[{index}].role must be one of {', '.join(ROLES)}")
    out: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": _text(index, message.get("content")),
    }
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [_call(index, c) for c in message["tool_calls"]]
    if role == "tool":
        out["tool_call_id"] = str(message.get("tool_call_id", ""))
    return out


def _text(index: int, content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "".join(str(t) for t in texts)
    raise MessageError(f"messages[{index}].content must be text or text parts (no images or audio)")


def _call(index: int, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise MessageError(f"messages[{index}].tool_calls needs function.name")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # not JSON: kept as text, the template renders what was sent
            arguments = json.loads(arguments or "{}")
    return {
        "id": str(call.get("id", "")),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two canonical messages say the same thing (tool-call ids aside)."""
    return _key(a) == _key(b)


def _key(message: dict[str, Any]) -> tuple[str, str, str]:
    calls = message.get("tool_calls")
    if not calls:  # most messages: no JSON to canonicalise (this runs for every message of every call)
        return message["role"], message["content"], ""
    named = [[c["function"]["name"], c["function"]["arguments"]] for c in calls]
    return message["role"], message["content"].strip(), json.dumps(named, sort_keys=True)


def starts_with(messages: list[dict[str, Any]], prefix: list[dict[str, Any]]) -> bool:
    return len(prefix) <= len(messages) and all(same(a, b) for a, b in zip(messages, prefix, strict=False))


def normalize_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list) or not all(_is_tool(t) for t in tools):
        raise MessageError("'tools' must be a list of {type: function, function: {name, ...}}")
    return list(tools)


def _is_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return tool.get("type") == "function" and isinstance(function, dict) and isinstance(function.get("name"), str)
