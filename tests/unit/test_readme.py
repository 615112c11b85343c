"""The README's claims a newcomer acts on first: how to call psrl, and which tools there are."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_first_lines_say_how_to_get_psrl_on_the_path() -> None:
    head = "\n".join(README.splitlines()[:20])
    assert ".venv/bin/psrl" in head and "source .venv/bin/activate" in head


def test_every_tool_is_listed() -> None:
    tools = sorted(p.stem for p in (ROOT / "tools").iterdir() if p.is_file() and not p.name.startswith(("_", ".")))
    assert tools, "no tools found"
    assert [t for t in tools if not re.search(rf"\b{t}\b", README)] == []
