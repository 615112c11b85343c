"""A restarted event logger's catch-up: what the proxy forwarded after the log's last record.

The order matters: the logger subscribes first (live messages queue in its sockets), waits until
the subscription carries traffic, then asks the proxy's retainer (`bus.retainer`) for every
message after its last record. It writes those, then the live ones, skipping the live messages the
catch-up already held (a message's key, its first event's sender, incarnation and seq, is unique
in a run). So the log continues in forwarding order with nothing missing and nothing twice, as
long as the retainer still held the log's last record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq

from bus.eventlog.reader import EventLogReader
from bus.retainer import CATCH_UP, DONE, EVENT, MessageKey, message_key
from bus.sockets import DEFAULT_SOCKET_OPTIONS, SocketOptions, make_socket

REPLY_TIMEOUT_S = 10.0
DEDUPE_WINDOW_S = 60.0  # live copies of caught-up messages arrive within moments; keys kept this long


def log_anchor(events_dir: str | Path) -> MessageKey | None:
    """The key of the log's last whole record, or None for an empty (new) log."""
    record = EventLogReader(events_dir).last_record()
    return message_key(list(record.frames)) if record is not None else None


@dataclass
class CatchUpResult:
    messages: list[list[Any]]
    anchor_found: bool


def request_catch_up(
    ctx: zmq.Context[zmq.Socket[bytes]],
    address: str,
    anchor: MessageKey | None,
    options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
    timeout_s: float = REPLY_TIMEOUT_S,
) -> CatchUpResult | None:
    """Every retained message after ``anchor``; None when the retainer did not answer in time."""
    sock = make_socket(ctx, zmq.DEALER, address, options=options, bind=False)
    try:
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.send_multipart([CATCH_UP, msgspec.msgpack.encode(list(anchor)) if anchor else b""])
        messages: list[list[Any]] = []
        deadline = time.monotonic() + timeout_s
        while (remaining_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            if not sock.poll(remaining_ms):
                break
            verb, *frames = sock.recv_multipart()
            if verb == EVENT:
                messages.append(frames)
                deadline = time.monotonic() + timeout_s  # a long catch-up is still progressing
            elif verb == DONE:
                summary = msgspec.msgpack.decode(frames[0]) if frames else {}
                return CatchUpResult(messages, bool(summary.get("anchor_found", False)))
        return None
    finally:
        sock.close(0)


@dataclass
class LiveDeduper:
    """Drops live messages that a catch-up already delivered."""

    keys: set[MessageKey] = field(default_factory=set)
    until: float = 0.0
    num_duplicates: int = 0

    def remember(self, keys: set[MessageKey]) -> None:
        self.keys = keys
        self.until = time.monotonic() + DEDUPE_WINDOW_S

    def is_duplicate(self, frames: list[Any]) -> bool:
        if not self.keys:
            return False
        if time.monotonic() > self.until:
            self.keys = set()
            return False
        key = message_key(frames)
        if key is None or key not in self.keys:
            return False
        self.keys.discard(key)
        self.num_duplicates += 1
        return True
