"""The agent section: agents that bring their own loop, through the OpenAI-compatible session gateway."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from psrl.config.base import Section, field, section
from psrl.errors import ConfigProblem


class GatewaySettings(Section):
    host: str = field(
        "127.0.0.1", "Interface the gateway's HTTP server binds (loopback; across hosts, the run's interface)."
    )
    port: int = field(0, "Port of the gateway (0 = any free port; the address is in the scheduler's log).", ge=0)
    token: str = field(
        "", "Bearer token every call must carry; empty = none on loopback, a random per-run token on any other host."
    )
    chat_template: str = field(
        "auto",
        "Chat template: auto (the model's own; the demo model's bundled one), hermes, llama3, demo, or a .jinja path.",
    )
    tool_parser: Literal["auto", "hermes", "llama3", "demo", "none"] = field(
        "auto", "How replies become tool_calls; auto = the template family's own."
    )
    max_trim_tokens: int = field(
        0, "Tokens at the end of the earlier conversation a template may render differently (TITO trim bound).", ge=0
    )
    max_body_bytes: int = field(1 << 20, "Largest request body (bigger: HTTP 413).", ge=1024)
    model_name: str = field("psrl", "The model name clients use (another name: HTTP 404).")


class Agent(Section):
    entry: str = field(
        "", "The agent as a Python callable, package.module:function(client, row) returning a reward or {score}."
    )
    command: str = field(
        "", "The agent as a command (shell), given OPENAI_BASE_URL, OPENAI_API_KEY and the row as JSON on stdin."
    )
    dataset: str = field("", "JSONL rows, one per prompt: messages (or prompt), optional tools, any other columns.")
    timeout_s: float = field(300.0, "An agent running longer fails its session.", gt=0)
    gateway: GatewaySettings = section(
        GatewaySettings, "The OpenAI-compatible session gateway (needs the agents extra)."
    )

    @property
    def enabled(self) -> bool:
        return bool(self.entry or self.command)


def agent_rules(c: Any) -> Iterator[ConfigProblem]:
    """An agent runs in multi-turn sessions, from a dataset, given as one of a callable or a command."""
    agent = c.agent
    if agent.entry and agent.command:
        yield ConfigProblem(
            ("agent.entry", "agent.command"),
            repr(agent.entry),
            "an agent is a callable or a command",
            "set one of agent.entry and agent.command",
        )
    if agent.enabled and not c.env.enable:
        yield ConfigProblem(
            ("agent.entry", "env.enable"), "False", "an agent runs in multi-turn sessions", "set env.enable=True"
        )
    if agent.enabled and not agent.dataset:
        yield ConfigProblem(
            ("agent.dataset",),
            "''",
            "an agent needs rows to work on",
            "set agent.dataset to a JSONL file of rows with messages (or prompt)",
        )
    if agent.entry and ":" not in agent.entry:
        yield ConfigProblem(
            ("agent.entry",),
            repr(agent.entry),
            "not package.module:function",
            "write the callable as package.module:function",
        )
