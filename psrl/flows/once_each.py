"""What a router takes once each in a launch: a request, a group's accept or drop, a buffer's consume.

The coordinator sends each of them once. A restarted coordinator sends again those its predecessor's
link logged but the router is logged nowhere as having handled (they may have died in the killed
process's socket), so the router can get a copy of one it holds queued, runs or has handled: it
drops the copy. Ids come in ascending runs, so each kind's taken ids are kept as ranges.
"""

from __future__ import annotations

from typing import Any

from bus.messages import Consume, GenerateRequest, GroupAccept, GroupDrop
from psrl.flows.id_ranges import IdRanges

ONCE_EACH = (GenerateRequest, GroupAccept, GroupDrop, Consume)


def once_key(message: Any) -> int | None:
    """The id a message of a once-each kind is taken by (None: not such a message)."""
    if isinstance(message, GenerateRequest):
        return message.request_id
    if isinstance(message, GroupAccept | GroupDrop):
        return message.prompt_id
    if isinstance(message, Consume):
        return message.buffer
    return None


class OnceEach:
    def __init__(self) -> None:
        self._taken: dict[type, IdRanges] = {kind: IdRanges() for kind in ONCE_EACH}

    def take(self, message: Any) -> bool:
        """Record ``message``; False if one of its kind with its id was taken before (a copy)."""
        key = once_key(message)
        if key is None:
            return True
        taken = self._taken[type(message)]
        if key in taken:
            return False
        taken.add(key)
        return True

    def has(self, message: Any) -> bool:
        key = once_key(message)
        return key is not None and key in self._taken[type(message)]
