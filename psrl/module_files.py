"""Import what a user names: a module by its dotted name, or a Python file by its path."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


class ModuleFileError(ImportError):
    """A ``.py`` path that Python cannot load as a module."""


def load_module(target: str, prefix: str) -> ModuleType:
    """``package.module``, or ``path/to/file.py`` loaded under a name unique to the path (``prefix_<hash>``)."""
    if not target.endswith(".py"):
        return importlib.import_module(target)
    spec = importlib.util.spec_from_file_location(f"{prefix}_{abs(hash(target))}", target)
    if spec is None or spec.loader is None:
        raise ModuleFileError(f"cannot load the file {target}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
