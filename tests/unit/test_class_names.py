"""One name per concept: no two classes in the shipped code share a name (tests excluded).

Two classes with one name made readers (and imports) guess which one a module meant; the glossary in
docs/protocol.md names each concept once.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bus", "psrl", "actors", "launch")


def class_definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_scan_sees_the_code() -> None:
    names = class_definitions()
    assert "StalenessLedger" in names and "RouterFlow" in names and len(names) > 300


def test_no_two_classes_share_a_name() -> None:
    doubled = {name: where for name, where in class_definitions().items() if len(where) > 1}
    assert not doubled, f"rename one of each (and add it to the glossary if it is a concept): {doubled}"
