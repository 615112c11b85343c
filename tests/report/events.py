"""Events built by hand for unit tests: the same structs the bus decodes into."""

from __future__ import annotations

from typing import Any

from bus.schema import Envelope, Event, Message

T0_NS = 1_800_000_000 * 10**9


def make_event(message: Message, sender: str, *, at_s: float = 0.0, seq: int = 1,
               model_version: int | None = None, incarnation: int = 0) -> Event[Any]:  # fmt: skip
    wall_ns = T0_NS + int(at_s * 1e9)
    envelope = Envelope(
        kind=message.KIND, schema_version=message.SCHEMA_VERSION, sender=sender, incarnation=incarnation,
        seq=seq, mono_ns=wall_ns, wall_ns=wall_ns, model_version=model_version,
    )  # fmt: skip
    return Event(envelope, message)
