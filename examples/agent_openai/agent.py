"""A small tool-using agent written with the openai SDK, as you would write it for any OpenAI API.

It is given a row (its opening messages and tools) and a client bound to its psrl session. Each
turn it asks the model; a tool call (``add``) is executed and its result sent back; an answer
``ans N`` ends the episode with its reward; anything else is told the expected format. The shipped
demo model's vocabulary is letters, digits, ``=`` and space, so every text it is sent keeps to that.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai

MAX_TURNS = 4  # the config's env.max_turns: the session ends there anyway
ANSWER = re.compile(r"ans (\d{1,7})")


def add(a: Any, b: Any) -> int:
    return int(a) + int(b)


def reward(row: dict[str, Any], text: str) -> float:
    """1 for the right sum; partial credit for right digits in the right places; 0 without an answer."""
    found = ANSWER.search(text)
    if found is None:
        return 0.0
    got, want = found.group(1)[::-1], str(row["answer"])[::-1]
    if got == want:
        return 1.0
    return 0.5 * sum(a == b for a, b in zip(got, want, strict=False)) / max(len(want), 1)


def run(client: openai.OpenAI, row: dict[str, Any]) -> dict[str, float]:
    messages: list[dict[str, Any]] = list(row["messages"])
    for _ in range(MAX_TURNS):
        try:
            answer = client.chat.completions.create(
                model="psrl", messages=messages, tools=row.get("tools"), max_tokens=12
            )
        except openai.ConflictError:  # the session is over (its turns are used up, or the run ended it)
            break
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if message.tool_calls:
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": _tool(call)})
            continue
        score = reward(row, message.content or "")
        if score > 0 or ANSWER.search(message.content or ""):
            return {"score": score, "acc": float(score == 1.0)}
        messages.append({"role": "user", "content": "answer as ans and the number or call add"})
    return {"score": 0.0, "acc": 0.0}


def _tool(call: Any) -> str:
    try:
        arguments = json.loads(call.function.arguments)
        return str(add(arguments.get("a", 0), arguments.get("b", 0))) if call.function.name == "add" else "err"
    except (ValueError, TypeError, AttributeError):
        return "err"
