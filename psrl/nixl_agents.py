"""NIXL agents (UCX) for the parameter server and the KV tier, paced so that an idle one sleeps.

nixl's Python ``nixl_agent`` hard-codes its progress thread's delay to 0, so every agent spins a
core even when idle: two idle agents took more than a core of a 2-core machine, CPU that the
transfers and the engine then lacked. ``make_agent`` sets the delay on the agent's config at the
moment it is built, the one place the Python API lets it through. 100 us costs no throughput;
1 ms halves a write's (measured on 48 MiB writes over UCX/TCP loopback).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from psrl.errors import MissingExtraError

PROGRESS_DELAY_US = 100
_BUILD_LOCK = threading.Lock()


def make_agent(prefix: str, feature: str) -> Any:
    """A UCX agent named ``prefix-<random>``; ``feature`` (the config that asked for NIXL) is named
    in the error when the ``kv`` extra is not installed."""
    try:
        from nixl import _api
    except ImportError:
        raise MissingExtraError(feature, "kv", "nixl") from None
    build = _api.nixlBind.nixlAgent

    def paced(name: str, config: Any) -> Any:
        config.pthrDelay = PROGRESS_DELAY_US
        return build(name, config)

    with _BUILD_LOCK:  # the module attribute is swapped for the one call, never seen by another
        _api.nixlBind.nixlAgent = paced
        try:
            return _api.nixl_agent(f"{prefix}-{uuid.uuid4().hex[:12]}", _api.nixl_agent_config(backends=["UCX"]))
        finally:
            _api.nixlBind.nixlAgent = build
