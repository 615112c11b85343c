"""What every bus message is made of: the envelope, the message base class and the kind registry.

A message kind is one frozen `msgspec.Struct` subclass of `Message` declared with `@message(kind)`.
The kind name is dotted and grouped by area (``gen.request``, ``gen.result``, ...) because it is
also the first ZeroMQ frame: SUB sockets filter by byte prefix, so ``gen.`` selects every
generation kind inside libzmq. Structs are encoded positionally (``array_like``), which is why a
new field may only be appended at the end with a default (a minor protocol change), and anything
else needs a new schema version plus an upgrade function in `bus.upgrade`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import IntEnum
from typing import ClassVar, Generic, TypeVar

import msgspec

# (major, minor). Major changes the envelope or record layout; minor adds kinds or trailing fields.
PROTOCOL_VERSION: tuple[int, int] = (1, 14)

_KIND_PATTERN = re.compile(r"^[a-z][a-z0-9]*(\.[a-z][a-z0-9_]*)+$")


class Channel(IntEnum):
    """Which proxy a kind travels through. Control never queues behind data."""

    EVENTS = 0
    CONTROL = 1


class Message(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """Base of every message kind. Subclasses are declared with `@message`."""

    KIND: ClassVar[str] = ""
    KIND_BYTES: ClassVar[bytes] = b""
    SCHEMA_VERSION: ClassVar[int] = 0
    CHANNEL: ClassVar[Channel] = Channel.EVENTS
    LOGGED: ClassVar[bool] = True  # sent on a link, it is also published (and so logged)


class Part(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """Base of structs nested inside messages (not kinds of their own)."""


class Envelope(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """Header of every event: who sent it, when, in which order and because of what.

    The event id is not sent separately: ``sender#incarnation:seq`` is unique in a run because
    each incarnation of an actor numbers its events 1, 2, 3, ... (see `event_id`).
    """

    kind: str
    schema_version: int
    sender: str
    incarnation: int
    seq: int
    mono_ns: int
    wall_ns: int
    parent: str | None = None
    model_version: int | None = None
    request_id: int | None = None
    prompt_id: int | None = None

    @property
    def event_id(self) -> str:
        return f"{self.sender}#{self.incarnation}:{self.seq}"

    @property
    def actor(self) -> str:
        """The sending actor incarnation, ``sender#incarnation``."""
        return f"{self.sender}#{self.incarnation}"


M = TypeVar("M", bound=Message)


class Event(msgspec.Struct, Generic[M], frozen=True, array_like=True, gc=False):
    """A decoded event: envelope plus typed message."""

    envelope: Envelope
    message: M

    @property
    def kind(self) -> str:
        return self.envelope.kind


CATALOGUE: dict[str, type[Message]] = {}
"""Every registered kind name -> its struct class, in declaration order."""


def message(
    kind: str, *, version: int = 1, channel: Channel = Channel.EVENTS, logged: bool = True
) -> Callable[[type[M]], type[M]]:
    """Register a message kind: ``@message("gen.request")`` above a `Message` subclass.

    ``logged=False``: a link does not publish what it sends of this kind (bulk data whose facts
    other kinds carry), so it never reaches the event log.
    """
    if not _KIND_PATTERN.match(kind):
        raise ValueError(f"kind {kind!r} must be dotted lower-case words grouped by area, like 'gen.request'")
    if version < 1:
        raise ValueError(f"kind {kind!r}: schema version must be >= 1, got {version}")

    def register(cls: type[M]) -> type[M]:
        if kind in CATALOGUE:
            raise ValueError(f"kind {kind!r} is already registered by {CATALOGUE[kind].__name__}")
        cls.KIND = kind
        cls.KIND_BYTES = kind.encode("ascii")
        cls.SCHEMA_VERSION = version
        cls.CHANNEL = channel
        cls.LOGGED = logged
        CATALOGUE[kind] = cls
        return cls

    return register


def kinds_matching(prefix: str) -> list[str]:
    """Registered kinds selected by a subscription prefix (as libzmq filters them)."""
    return [kind for kind in CATALOGUE if kind.startswith(prefix)]
