"""The import contracts in pyproject.toml: the library layer names every child of psrl, and the
front door (the `psrl` command and `psrl.run`) reaches the launcher by plain imports only."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import psrl

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
FRONT_DOOR = "psrl.cli"


def _top_contract_layers() -> list[set[str]]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers: list[str] = contracts[0]["layers"]
    return [{name.strip() for name in layer.replace("|", ":").split(":")} for layer in layers]


def test_the_top_contract_places_every_child_of_psrl() -> None:
    layers = _top_contract_layers()
    assert layers[0] == {FRONT_DOOR} and layers[1] == {"launch"}, "the front door sits above the launcher"
    library = layers[3]
    children = {f"psrl.{m.name}" for m in pkgutil.iter_modules(psrl.__path__)} - {FRONT_DOOR}
    missing = sorted(children - library)
    assert not missing, f"add {missing} to the library layer of the first import contract in pyproject.toml"
    assert not sorted(library - children), "the library layer names a module that does not exist"


def _string_imports_of_launch(path: Path) -> list[int]:
    """Lines where a string constant names a module of the launcher (``"launch.x"``, ``"launch.x:y"``)."""
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value.startswith("launch.") or node.value.startswith("launch:"))
        and " " not in node.value
    ]


def test_nothing_in_psrl_names_the_launcher_by_string() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "psrl").rglob("*.py"))
        if (lines := _string_imports_of_launch(path))
    }
    assert not found, f"import the launcher with a plain import from the front door instead: {found}"
