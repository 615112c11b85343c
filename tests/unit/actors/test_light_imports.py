"""Actors that handle no tensors start without torch: a replacement router, coordinator or logger
is serving in the time of its own imports, which torch (seconds on a loaded 2-core machine) dominated."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")


@pytest.mark.parametrize("module", ["actors.router", "actors.coordinator", "actors.logger"])
def test_an_actor_without_tensors_imports_no_torch(module: str) -> None:
    probe = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == [], f"importing {module} loads {loaded}"
