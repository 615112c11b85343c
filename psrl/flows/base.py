"""What every flow shares: a handler table by message kind and an outbox of effects."""

from __future__ import annotations

from typing import Any, ClassVar

from bus.schema import Message
from psrl.flows.effects import Effect, Handler, Publish, Send, Timer


class UnhandledKindError(KeyError):
    """A flow was given a message kind it does not handle (its driver's input table is wrong)."""


class Flow:
    """Base of the flows. A subclass lists its inputs in ``handlers()``: kind -> method(message, now),
    and names in ``BUS_KINDS`` those it learns from the bus (it subscribes to them); the others are
    addressed to it on its link.

    Handlers change the flow's state and queue effects with ``send`` and ``publish``; ``handle``
    returns them. A flow reads no clock of its own and does no I/O, so the same sequence of
    (message, time) pairs always gives the same effects.
    """

    BUS_KINDS: ClassVar[tuple[type[Message], ...]] = ()

    def __init__(self) -> None:
        self._out: list[Effect] = []
        self._handlers: dict[type[Message], Handler] = self.handlers()
        unhandled = set(self.BUS_KINDS) - set(self._handlers)
        if unhandled:
            raise TypeError(
                f"{type(self).__name__} subscribes to {sorted(k.KIND for k in unhandled)} without a handler"
            )

    def handlers(self) -> dict[type[Message], Handler]:
        """The kinds this flow handles, each with its handler."""
        return {}

    @property
    def kinds(self) -> frozenset[type[Message]]:
        return frozenset(self._handlers)

    @property
    def link_kinds(self) -> frozenset[type[Message]]:
        """The kinds addressed to this flow on its link (every handled kind not from the bus)."""
        return frozenset(self._handlers) - set(self.BUS_KINDS)

    def handle(self, message: Message, now: float) -> list[Effect]:
        """Handle one message received at ``now`` (seconds); the effects to perform, in order."""
        handler = self._handlers.get(type(message))
        if handler is None:
            raise UnhandledKindError(f"{type(self).__name__} does not handle {message.KIND!r}")
        handler(message, now)
        return self.take()

    def undeliverable(self, send: Send, now: float) -> list[Effect]:
        """A ``Send`` could not be delivered (its peer is gone); by default it is dropped."""
        return []

    def timers(self) -> list[Timer]:
        """Periodic work: each timer's callback runs about every ``interval_s`` seconds."""
        return []

    # ------------------------------------------------------------------ for subclasses

    def send(self, to: str, message: Message, **ids: Any) -> None:
        self._out.append(Send(to, message, **ids))

    def publish(self, message: Message, **ids: Any) -> None:
        self._out.append(Publish(message, **ids))

    def emit(self, effect: Effect) -> None:
        self._out.append(effect)

    def take(self) -> list[Effect]:
        """The queued effects (the outbox is emptied)."""
        out, self._out = self._out, []
        return out
