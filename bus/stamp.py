"""Stamping envelopes: one numbered stream of events per sender incarnation."""

from __future__ import annotations

import time

from bus.errors import BusError
from bus.schema import Envelope, Message


class Stamper:
    """Numbers the events of one sender incarnation 1, 2, 3, ... and stamps their envelopes.

    `sender` names one sequence stream and must be unique within the run for this incarnation:
    an actor publishes as ``<actor>`` and, if it uses request/reply, stamps its requests as
    ``<actor>.req`` and its replies as ``<actor>.rep`` (their sequences would otherwise leave
    holes in the published stream that look like lost events).
    """

    def __init__(self, sender: str, incarnation: int = 0) -> None:
        if not sender or "#" in sender or ":" in sender or not sender.isprintable():
            raise BusError(f"sender name {sender!r} must be printable, non-empty and contain neither '#' nor ':'")
        if incarnation < 0:
            raise BusError(f"incarnation must be >= 0, got {incarnation}")
        self.sender = sender
        self.incarnation = incarnation
        self.seq = 0

    def stamp(
        self,
        message: Message,
        parent: str | None = None,
        model_version: int | None = None,
        request_id: int | None = None,
        prompt_id: int | None = None,
    ) -> Envelope:
        self.seq += 1
        return Envelope(
            message.KIND,
            message.SCHEMA_VERSION,
            self.sender,
            self.incarnation,
            self.seq,
            time.monotonic_ns(),
            time.time_ns(),
            parent,
            model_version,
            request_id,
            prompt_id,
        )
