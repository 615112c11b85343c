"""What `psrl tap` shows: event filters and the readable and JSON renderings of an event."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgspec
import numpy as np

from bus.plain import readable, to_builtins
from bus.schema import Event

_SHOWN_ITEMS = 8
# what every actor or instance sends on a timer: thousands of lines a minute that bury the run's events
PERIODIC_KINDS = ("actor.heartbeat", "inst.status", "router.status", "kv.tier")


def hidden_kinds(kinds: Iterable[str], show_all: bool) -> tuple[str, ...]:
    """The periodic kinds a tap hides: all of them by default, none with --all, and never one that a
    --kind prefix asks for."""
    if show_all:
        return ()
    asked = tuple(kinds)
    return tuple(kind for kind in PERIODIC_KINDS if not any(kind.startswith(prefix) for prefix in asked))


@dataclass(frozen=True)
class TapFilter:
    """Which events to show. Kind prefixes filter inside libzmq; the rest is checked per event."""

    kinds: tuple[str, ...] = ()
    actors: tuple[str, ...] = ()
    request_ids: tuple[int, ...] = ()
    versions: tuple[int, ...] = ()
    hidden: tuple[str, ...] = ()  # kind prefixes not shown (see `hidden_kinds`)

    def subscriptions(self) -> list[str]:
        return list(self.kinds) or [""]

    def matches(self, event: Event[Any]) -> bool:
        env = event.envelope
        if any(env.kind.startswith(prefix) for prefix in self.hidden):
            return False
        base = env.sender.split("/", 1)[0]  # an actor's control (/ctl) and heartbeat (/hb) streams are its own
        if self.actors and base not in self.actors and env.sender not in self.actors and env.actor not in self.actors:
            return False
        if self.request_ids and not set(self.request_ids) & set(request_ids_of(event)):
            return False
        return not self.versions or bool(set(self.versions) & set(versions_of(event)))


def request_ids_of(event: Event[Any]) -> list[int]:
    """Request ids an event is about: the envelope's, and the message's request_id(s) fields."""
    ids = [] if event.envelope.request_id is None else [event.envelope.request_id]
    message = event.message
    single = getattr(message, "request_id", None)
    if isinstance(single, int):
        ids.append(single)
    many = getattr(message, "request_ids", None)
    if isinstance(many, list):
        ids.extend(many)
    elif isinstance(many, np.ndarray):  # a batch of streamed tokens (gen.tokens)
        ids.extend(int(i) for i in many.ravel().tolist())
    return ids


def versions_of(event: Event[Any]) -> list[int]:
    """Model versions an event is about: the envelope's, and the message's version field."""
    versions = [] if event.envelope.model_version is None else [event.envelope.model_version]
    version = getattr(event.message, "version", None)
    if isinstance(version, int):
        versions.append(version)
    return versions


def format_json(event: Event[Any]) -> str:
    data = {
        "event_id": event.envelope.event_id,
        "envelope": to_builtins(event.envelope),
        "message": readable(event.message),
    }
    return json.dumps(data, separators=(",", ":"))


def format_line(event: Event[Any]) -> str:
    """One readable line: wall time, event id, kind, envelope context, then the message fields."""
    env = event.envelope
    when = dt.datetime.fromtimestamp(env.wall_ns / 1e9, tz=dt.timezone.utc).strftime("%H:%M:%S.%f")
    context = [
        f"{label}={value}"
        for label, value in (
            ("req", env.request_id),
            ("prompt", env.prompt_id),
            ("v", env.model_version),
            ("parent", env.parent),
        )
        if value is not None
    ]
    fields = [f"{name}={_short(getattr(event.message, name))}" for name in event.message.__struct_fields__]
    return " ".join([when, f"{env.event_id:<22}", f"{env.kind:<22}", *context, "|", *fields])


def _short(value: Any) -> str:
    if isinstance(value, bytes):  # a nested record (msgpack): shown decoded
        return _short(readable(value))
    if isinstance(value, np.ndarray):
        items = _items(value.ravel().tolist())
        return f"{value.dtype}{list(value.shape)}{items}"
    if isinstance(value, IntEnum):
        return value.name.lower()
    if isinstance(value, msgspec.Struct):
        inner = ",".join(f"{n}={_short(getattr(value, n))}" for n in value.__struct_fields__)
        return "{" + inner + "}"
    if isinstance(value, list):
        return _items(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return repr(value) if (not value or " " in value) else value
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_short(v)}" for k, v in value.items()) + "}"
    return str(value)


def _items(values: Iterable[Any]) -> str:
    listed = list(values)
    shown = ",".join(_short(v) for v in listed[:_SHOWN_ITEMS])
    more = f",…+{len(listed) - _SHOWN_ITEMS}" if len(listed) > _SHOWN_ITEMS else ""
    return f"[{shown}{more}]"
