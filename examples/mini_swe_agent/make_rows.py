"""Writes rows.jsonl: small file tasks, each with the opening messages mini-swe-agent will send
(``mini_psrl.yaml``'s templates rendered as it renders them: Jinja, no trailing newline)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from jinja2 import StrictUndefined, Template

HERE = Path(__file__).resolve().parent
WORDS = ["hello", "world", "psrl", "agent", "token", "turns", "model", "green"]


def rows() -> list[dict[str, object]]:
    agent = yaml.safe_load((HERE / "mini_psrl.yaml").read_text())["agent"]
    out = []
    for number, word in enumerate(WORDS * 2):
        name = f"note{number}.txt"
        task = f"Create the file {name} containing the word {word}."
        render = lambda source, **values: Template(source, undefined=StrictUndefined).render(**values)  # noqa: E731
        messages = [
            {"role": "system", "content": render(agent["system_template"])},
            {"role": "user", "content": render(agent["instance_template"], task=task)},
        ]
        out.append({"messages": messages, "task": task, "file": name, "expected": word})
    return out


if __name__ == "__main__":
    lines = [json.dumps(row) for row in rows()]
    (HERE / "rows.jsonl").write_text("\n".join(lines) + "\n")
