"""Receiving events: subscribe by kind prefix, decode, count what is dropped or missing.

Filtering by kind happens inside libzmq (the topic frame is the kind name), so a subscriber to
``gen.`` never even copies the other kinds. Bad messages are counted per reason in `drops` and
skipped; `gaps` counts events lost upstream (only meaningful when subscribed to every kind).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from bus.codec import DEFAULT_MAX_MESSAGE_BYTES, Decoder
from bus.drops import DropCounter
from bus.errors import DecodeError
from bus.gaps import GapTracker
from bus.io import StreamReceiver
from bus.schema import Event
from bus.sockets import DEFAULT_SOCKET_OPTIONS, SocketOptions, make_socket


class Subscriber:
    """One SUB socket connected to a proxy's XPUB side (or any publisher).

    A received message may hold a batch of events; `recv` and `try_recv` hand them out one at a
    time (keeping the rest in `pending`), `recv_batch` returns all events of the next message.
    """

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        address: str,
        kinds: Sequence[str] = ("",),
        *,
        options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str = "subscriber",
    ) -> None:
        self.address = address
        self.kinds = tuple(kinds)
        self.socket = make_socket(ctx, zmq.SUB, address, options=options, subscribe=[k.encode() for k in self.kinds])
        self.decoder = Decoder(max_message_bytes)
        self.drops = DropCounter(name)
        self.gaps = GapTracker(from_first_seen=True)
        self.pending: deque[Event[Any]] = deque()
        self._receiver = StreamReceiver(self.socket)
        self._is_tracking_gaps = "" in self.kinds

    def recv_frames(self, timeout_ms: int | None = None) -> list[Any] | None:
        """The next message's raw frames (see `bus.io.recv_event_frames`), or None after `timeout_ms`."""
        return self._receiver.recv(timeout_ms)

    def recv_batch(self, timeout_ms: int | None = None) -> list[Event[Any]]:
        """Pending events, else the events of the next message; [] on timeout or if it was dropped."""
        if self.pending:
            batch = list(self.pending)
            self.pending.clear()
            return batch
        frames = self.recv_frames(timeout_ms)
        return [] if frames is None else self.decode(frames)

    def try_recv(self) -> Event[Any] | None:
        """The next event if one is waiting; None if nothing is waiting or the message was dropped."""
        if not self.pending:
            frames = self.recv_frames(0)
            if frames is None:
                return None
            self.pending.extend(self.decode(frames))
        return self.pending.popleft() if self.pending else None

    def recv(self, timeout_ms: int | None = None) -> Event[Any] | None:
        """The next good event, skipping (and counting) bad messages; None when `timeout_ms` passes."""
        if self.pending:
            return self.pending.popleft()
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        remaining = timeout_ms
        while (frames := self.recv_frames(remaining)) is not None:
            events = self.decode(frames)
            if events:
                self.pending.extend(events[1:])
                return events[0]
            if deadline is not None:  # a dropped message does not restart the timeout
                remaining = max(0, int((deadline - time.monotonic()) * 1000))
        return None

    def decode(self, frames: Sequence[Any]) -> list[Event[Any]]:
        """Decode one message; a bad one is counted in `drops` and gives no events."""
        try:
            events = self.decoder.decode(frames)
        except DecodeError as error:
            self.drops.record(error)
            return []
        if self._is_tracking_gaps:
            for event in events:
                self.gaps.observe(event.envelope)
        return events

    def close(self) -> None:
        self.socket.close()
