"""Parsing a model's reply into OpenAI ``tool_calls``, per template family.

* ``hermes`` (Qwen2.5/Qwen3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks;
  text outside them is the content.
* ``llama3`` (Llama 3.x JSON tool calling): the whole reply is one JSON object ``{"name": ...,
  "parameters": {...}}`` (or ``"arguments"``), optionally after ``<|python_tag|>``; several calls are
  separated by ``;``.
* ``demo``: ``call NAME key=value ...`` at the end of the reply (the demo model's vocabulary).
* ``none``: never a tool call.

A reply that looks like a tool call but does not parse (bad JSON, no name) is returned whole as
content: the agent sees what the model wrote, and can tell it so. Parsing never raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PARSERS = ("hermes", "llama3", "demo", "none")
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_DEMO = re.compile(r"(?:^| )call ([a-z][a-z0-9]*)((?: [a-z][a-z0-9]*=[a-z0-9]*)*) *$")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it


@dataclass(frozen=True)
class Parsed:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    malformed: bool = False  # it looked like a tool call but did not parse (returned as content)


def parse(parser: str, text: str) -> Parsed:
    """``text`` (the reply, special tokens removed) as content and tool calls."""
    return _BY_NAME.get(parser, _none)(text)


def parser_for(family: str, override: str = "auto") -> str:
    """The parser to use: ``override`` unless auto, else the template family's own."""
    if override != "auto":
        return override
    return family if family in PARSERS else "none"


def _none(text: str) -> Parsed:
    return Parsed(text)


def _hermes(text: str) -> Parsed:
    if "<tool_call>" not in text:
        return Parsed(text)
    calls = []
    for block in _HERMES.findall(text):
        call = _call(_json(block), "arguments")
        if call is None:
            return Parsed(text, malformed=True)
        calls.append(call)
    if not calls:  # an unclosed <tool_call>
        return Parsed(text, malformed=True)
    return Parsed(_HERMES.sub("", text).strip(), tuple(calls))


def _llama3(text: str) -> Parsed:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return Parsed(text)
    calls = []
    for part in body.split(";"):
        call = _call(_json(part), "parameters")
        if call is None:
            return Parsed(text, malformed=True)
        calls.append(call)
    return Parsed("", tuple(calls))


def _demo(text: str) -> Parsed:
    found = _DEMO.search(text)
    if found is None:
        return Parsed(text)
    arguments = dict(pair.split("=", 1) for pair in found.group(2).split())
    return Parsed(text[: found.start()].strip(), (ToolCall(found.group(1), json.dumps(arguments)),))


def _json(text: str) -> Any:
    try:
        return json.loads(text.strip())
    except ValueError:
        return None


def _call(value: Any, arguments_key: str) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    if arguments_key not in value and "arguments" in value:  # Llama writes either key
        arguments_key = "arguments"
    arguments = value.get(arguments_key, {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string already
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


_BY_NAME: dict[str, Callable[[str], Parsed]] = {"hermes": _hermes, "llama3": _llama3, "demo": _demo, "none": _none}
