"""Stamping envelopes: one numbered stream of events per sender incarnation."""

from __future__ import annotations

import time

from bus.errors import BusError
from bus.schema import Envelope, Message


class Cause:
    """The event an actor is handling right now: everything it sends meanwhile names it as its parent.

    One per actor incarnation, shared by its publisher and its links; the actor sets ``event_id``
    around each handler (``None`` outside of one, e.g. in a timer).
    """

    __slots__ = ("event_id",)

    def __init__(self) -> None:
        self.event_id: str | None = None


class Stamper:
    """Numbers the events of one sender incarnation 1, 2, 3, ... and stamps their envelopes.

    `sender` names one sequence stream and must be unique within the run for this incarnation:
    an actor publishes as ``<actor>`` (and ``<actor>/ctl`` on the control channel), and its links
    stamp what they send as ``<link>.link`` (logged kinds) and ``<link>.stream`` (the others), so
    that each stream the event log holds is gap-free.
    """

    def __init__(self, sender: str, incarnation: int = 0, cause: Cause | None = None) -> None:
        if not sender or "#" in sender or ":" in sender or not sender.isprintable():
            raise BusError(f"sender name {sender!r} must be printable, non-empty and contain neither '#' nor ':'")
        if incarnation < 0:
            raise BusError(f"incarnation must be >= 0, got {incarnation}")
        self.sender = sender
        self.incarnation = incarnation
        self.cause = cause
        self.seq = 0

    def take_back(self, count: int = 1) -> None:
        """The last ``count`` envelopes were never sent (their peer was gone): their numbers are reused,
        so the stream stays gap-free."""
        self.seq -= count

    def stamp(
        self,
        message: Message,
        parent: str | None = None,
        model_version: int | None = None,
        request_id: int | None = None,
        prompt_id: int | None = None,
    ) -> Envelope:
        """The next envelope of this stream; ``parent`` defaults to the event being handled."""
        self.seq += 1
        if parent is None and self.cause is not None:
            parent = self.cause.event_id
        return Envelope(
            kind=message.KIND,
            schema_version=message.SCHEMA_VERSION,
            sender=self.sender,
            incarnation=self.incarnation,
            seq=self.seq,
            mono_ns=time.monotonic_ns(),
            wall_ns=time.time_ns(),
            parent=parent,
            model_version=model_version,
            request_id=request_id,
            prompt_id=prompt_id,
        )
