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


@pytest.fixture(scope="session")
def gateway() -> Iterator[EngineGateway]:
    with EngineGateway(DEMO, settings=Settings(max_turn_tokens=12), server=ServerSettings(token=TOKEN)) as running:
        yield running
