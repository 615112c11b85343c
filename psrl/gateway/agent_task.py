"""An agent run's prompts: dataset rows, each rendered with the gateway's chat template.

A row is a JSON object with ``messages`` (OpenAI chat messages; or ``prompt``, a string taken as
the user's message), optional ``tools`` (OpenAI function tools) and any other columns (the agent
gets the whole row). Prompt ``index`` is row ``index mod len(rows)``. The run's first turn of each
session is generated from this rendering, ahead of the agent's first call, which must carry the
row's ``messages`` and ``tools`` (docs/gateway.md: the first call).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psrl.gateway.chat_templates import ChatTemplate, load_template
from psrl.gateway.codec import Codec, load_codec
from psrl.gateway.messages import normalize, normalize_tools
from psrl.tasks.base import Prompt, Reward


def read_rows(path: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: an agent dataset is JSONL, one object per line, at least one")
    return rows


def conversation(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The row's opening messages and tools, canonical."""
    messages = row.get("messages") or [{"role": "user", "content": str(row.get("prompt", ""))}]
    return normalize(messages), normalize_tools(row.get("tools"))


@dataclass
class AgentTask:
    rows: list[dict[str, Any]]
    template: ChatTemplate
    codec: Codec
    name: str = "agent"

    @classmethod
    def from_config(cls, config: Any) -> AgentTask:
        model_dir = model_directory(config)
        template = load_template(model_dir, config.agent.gateway.chat_template)
        return cls(read_rows(config.agent.dataset), template, load_codec(model_dir))

    def prompt(self, index: int) -> Prompt:
        row = self.rows[index % len(self.rows)]
        messages, tools = conversation(row)
        text = self.template.render(messages, tools, True)
        return Prompt(
            index, str(row.get("kind", "agent")), text, str(row.get("answer", "")), tuple(self.codec.encode(text)), row
        )

    def reward(self, prompt: Prompt, response: str) -> Reward:
        return Reward(0.0, 0.0)  # an agent's reward comes with its session's end, not from the text

    def make(self, prompt: Prompt) -> Any:
        raise NotImplementedError("an agent session runs its agent (agent.entry or agent.command), not an environment")


def model_directory(config: Any) -> str:
    if config.model.tokenizer_path or config.model.path:
        return str(config.model.tokenizer_path or config.model.path)
    return str(Path(__file__).resolve().parent.parent / "assets" / "demo_model")
