"""Built-in checker: every sender numbers its events 1, 2, 3, ... per incarnation.

It re-derives the sequence number each event should carry from the events before it and
compares it with the recorded one. A disagreement is an event lost before the logger (at a
high-water mark, or in a crash), a reordering, or a sender that breaks the numbering rule.
"""

from __future__ import annotations

from typing import Any

from bus.schema import Event
from psrl.replay.checker import Checker, register_checker


@register_checker
class SequenceChecker(Checker):
    """Every event's sequence number: a gap is an event lost before the logger."""

    name = "sequence"
    inputs = ("",)
    decisions = ("",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_seq: dict[str, int] = {}

    def observe(self, event: Event[Any]) -> None:
        env = event.envelope
        self.last_seq[env.actor] = max(self.last_seq.get(env.actor, 0), env.seq)

    def redecide(self, event: Event[Any]) -> int:
        return self.last_seq.get(event.envelope.actor, 0) + 1

    def recorded(self, event: Event[Any]) -> int:
        return event.envelope.seq
