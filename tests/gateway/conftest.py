"""One live gateway (uvicorn on loopback, the embedded engine with the demo model) for the module
tests that talk to it over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from psrl.gateway.local import EngineGateway
from psrl.gateway.server import ServerSettings
from psrl.gateway.sessions import Settings

DEMO = "psrl/assets/demo_model"
TOKEN = "run-secret"
TOP_LOGPROBS = 5  # alternatives per token the engine returns


@pytest.fixture(scope="session")
def gateway() -> Iterator[EngineGateway]:
    settings, server = Settings(max_turn_tokens=12), ServerSettings(token=TOKEN)
    with EngineGateway(DEMO, settings=settings, server=server, num_logprobs=TOP_LOGPROBS) as running:
        yield running
