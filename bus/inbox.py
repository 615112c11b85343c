"""An actor's inbox: several subscriptions read in priority order, control before data.

Control travels on its own proxy and socket, so it is never queued behind data inside ZeroMQ;
the inbox makes sure it is not queued behind data in the actor either, by always taking what the
higher-priority subscriber has before looking at the next one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import zmq

from bus.schema import Event
from bus.subscriber import Subscriber


class Inbox:
    """Hands out events from `subscribers`, listed highest priority first (control, then events)."""

    def __init__(self, subscribers: Sequence[Subscriber]) -> None:
        if not subscribers:
            raise ValueError("an inbox needs at least one subscriber")
        self.subscribers = list(subscribers)
        self._poller = zmq.Poller()
        for sub in self.subscribers:
            self._poller.register(sub.socket, zmq.POLLIN)

    def next(self, timeout_ms: int | None = None) -> Event[Any] | None:
        """The next event by priority; None when nothing arrives within `timeout_ms` (None = wait)."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while True:
            for sub in self.subscribers:
                event = sub.try_recv()
                if event is not None:
                    return event
            remaining = None if deadline is None else int((deadline - time.monotonic()) * 1000)
            if remaining is not None and remaining <= 0:
                return None
            if not self._poller.poll(remaining) and remaining is not None:
                return None
