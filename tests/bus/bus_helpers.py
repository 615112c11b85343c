"""Helpers shared by the bus tests (imported as `bus_helpers`; tests/bus is on sys.path)."""

from __future__ import annotations

import time
from typing import Any

from bus.publisher import Publisher
from bus.subscriber import Subscriber


def wait_connected(publisher: Publisher, timeout_s: float = 10.0) -> None:
    """Block until a subscription reached `publisher` on both channels (no slow-joiner losses)."""
    if not publisher.wait_subscribed(timeout_s):
        raise TimeoutError(f"no subscription reached publisher {publisher.stamper.sender} in {timeout_s} s")


def recv_all(subscriber: Subscriber, count: int, timeout_s: float = 20.0) -> list[Any]:
    """Receive `count` events (fails the test if they do not all arrive)."""
    events = []
    deadline = time.monotonic() + timeout_s
    while len(events) < count:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise TimeoutError(f"received {len(events)} of {count} events")
        event = subscriber.recv(remaining_ms)
        if event is not None:
            events.append(event)
    return events
