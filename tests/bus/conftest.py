"""Fixtures of the bus tests: real ZeroMQ contexts, a real proxy, real sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from bus.addresses import BusAddresses, plan_addresses
from bus.proxy import BusProxy


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def proxy(ctx: zmq.Context, tmp_path: Path) -> Iterator[BusAddresses]:
    """A running proxy pair (ipc under the test's run directory); yields its addresses."""
    bus_proxy = BusProxy(plan_addresses(tmp_path, "ipc"), ctx=ctx)
    addresses = bus_proxy.start()
    yield addresses
    bus_proxy.stop()
