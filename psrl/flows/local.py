"""Flows wired to each other in one process: in-memory queues in place of links and the bus.

``LocalBus`` delivers what flows emit to the named nodes it knows: a ``Send`` to its peer (and,
as a link logs it, a sent message of a logged kind to every node subscribed to the kind too), a
``Publish`` to every node subscribed to the kind, in the order they were emitted. A ``Send`` to
a peer it does not know goes back to its sender's ``undeliverable``; other effects (a weight push)
go to ``on_other``. The in-process driver and the simulator both run on it; a ``tap`` sees every
effect on the way (the simulator's statistics, a test's record).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from typing import Protocol

from bus.schema import Message
from psrl.flows.effects import Effect, Publish, Send


class MessageTarget(Protocol):
    """Anything that takes messages as a flow does (a flow, a modelled instance, a recorder)."""

    def handle(self, message: Message, now: float) -> list[Effect]: ...

    def undeliverable(self, send: Send, now: float) -> list[Effect]: ...


Tap = Callable[[str, Effect, float], None]


class LocalBus:
    def __init__(self, *, tap: Tap | None = None) -> None:
        self.nodes: dict[str, MessageTarget] = {}
        self.subscribers: dict[type[Message], list[str]] = defaultdict(list)
        self.on_other: Callable[[str, Effect, float], None] | None = None
        self.tap = tap
        self._queue: deque[tuple[str, Message]] = deque()

    def attach(self, name: str, node: MessageTarget, subscribes: Iterable[type[Message]] = ()) -> None:
        """Deliver sends to ``name`` and publications of the ``subscribes`` kinds to ``node``."""
        self.nodes[name] = node
        for kind in subscribes:
            self.subscribers[kind].append(name)

    def post(self, sender: str, effects: Iterable[Effect], now: float) -> None:
        """Queue what ``sender`` emitted; nothing is handled until ``deliver``."""
        for effect in effects:
            if self.tap is not None:
                self.tap(sender, effect, now)
            if isinstance(effect, Send):
                self._send(sender, effect, now)
            elif isinstance(effect, Publish):
                self._publish(effect.message)
            elif self.on_other is not None:
                self.on_other(sender, effect, now)
            else:
                raise TypeError(f"nobody performs {type(effect).__name__} (set LocalBus.on_other)")

    def _send(self, sender: str, send: Send, now: float) -> None:
        if send.to not in self.nodes:
            self.post(sender, self.nodes[sender].undeliverable(send, now), now)
            return
        self._queue.append((send.to, send.message))
        if send.message.LOGGED:
            self._publish(send.message)

    def _publish(self, message: Message) -> None:
        for name in self.subscribers.get(type(message), ()):
            self._queue.append((name, message))

    def deliver(self, now: float) -> set[str]:
        """Hand every queued message to its node, and what that emits, until nothing is left;
        returns the names of the nodes that handled something."""
        handled: set[str] = set()
        while self._queue:
            name, message = self._queue.popleft()
            self.post(name, self.nodes[name].handle(message, now), now)
            handled.add(name)
        return handled
