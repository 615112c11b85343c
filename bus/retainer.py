"""The proxy's memory of recent messages, so that a restarted event logger loses nothing.

ZeroMQ keeps nothing for a subscriber that is gone: a logger that dies loses what it had not yet
written and everything published until its replacement subscribes, and the log then has gaps
that stop a router or coordinator from rebuilding its state from it. The proxies see every
message in the order they forward it; each hands a copy to its capture socket (a PUB, so a slow
retainer drops copies instead of stalling the proxy), and the retainer keeps the most recent
ones, bounded by count and bytes. A restarted logger asks for every message after the last
record of its log (``CatchUp``) and gets them in forwarding order, then continues live.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import msgspec
import zmq

from bus.schema import Envelope
from bus.sockets import DEFAULT_SOCKET_OPTIONS, SocketOptions, bound_address, make_socket

MAX_MESSAGES = 200_000
MAX_BYTES = 256 << 20
CATCH_UP = b"catch-up"
EVENT = b"E"
DONE = b"D"

# (sender, incarnation, seq) of a message's first event: how a logged record is found again
MessageKey = tuple[str, int, int]

_first_envelopes = msgspec.msgpack.Decoder(list[tuple[Envelope, msgspec.Raw]])


def first_envelope(frames: list[Any]) -> Envelope | None:
    """The envelope of an event message's (topic, batch of events) first event, or None."""
    if len(frames) < 2:
        return None
    try:
        events = _first_envelopes.decode(frames[1])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return events[0][0] if events else None


def message_key(frames: list[Any]) -> MessageKey | None:
    """The key of an event message, or None for anything else."""
    envelope = first_envelope(frames)
    return (envelope.sender, envelope.incarnation, envelope.seq) if envelope is not None else None


class Retainer:
    """Keeps recent proxy messages and serves catch-ups, in a thread of the proxy's process."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        serve_address: str,
        options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
        *,
        max_messages: int = MAX_MESSAGES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._messages: deque[tuple[bytes, ...]] = deque()
        self._num_bytes = 0
        self.num_evicted = 0
        self._capture = ctx.socket(zmq.SUB)
        self._capture.setsockopt(zmq.RCVHWM, 0)
        self._capture.setsockopt(zmq.SUBSCRIBE, b"")
        # a catch-up is sent at once; the ring already bounds its size
        self._serve = make_socket(ctx, zmq.ROUTER, serve_address, options=options)
        self._serve.setsockopt(zmq.SNDHWM, 0)
        self.address = bound_address(self._serve)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bus-retainer", daemon=True)

    def watch(self, capture_address: str) -> None:
        """Take copies from a proxy's capture PUB bound at ``capture_address`` (before `start`)."""
        self._capture.connect(capture_address)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._capture, zmq.POLLIN)
        poller.register(self._serve, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                if self._capture in ready:
                    self._keep_available()
                if self._serve in ready:
                    self._answer()
        except zmq.ContextTerminated:
            pass  # the proxy's context went first (a process shutting down): nothing left to serve
        finally:
            self._capture.close(0)
            self._serve.close(0)

    def _keep_available(self) -> None:
        for _ in range(1000):
            try:
                frames = self._capture.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # single frames are subscriptions flowing back through the proxy; frames that are no event
            # message (a flood of garbage) would only push real history out of the ring
            if len(frames) >= 2 and first_envelope(frames) is not None:
                self.keep(tuple(frames))

    def keep(self, frames: tuple[bytes, ...]) -> None:
        self._messages.append(frames)
        self._num_bytes += sum(len(f) for f in frames)
        while len(self._messages) > self.max_messages or self._num_bytes > self.max_bytes:
            evicted = self._messages.popleft()
            self._num_bytes -= sum(len(f) for f in evicted)
            self.num_evicted += 1

    def after(self, anchor: MessageKey | None) -> tuple[list[tuple[bytes, ...]], bool]:
        """Messages after ``anchor`` in forwarding order, and whether the anchor was found (if not,
        every kept message: the anchor is older than all of them, e.g. from an earlier launch)."""
        messages = list(self._messages)
        if anchor is None:
            return messages, False
        for index in range(len(messages) - 1, -1, -1):
            if message_key(list(messages[index])) == anchor:
                return messages[index + 1 :], True
        return messages, False

    def _answer(self) -> None:
        try:
            ident, verb, anchor_bytes = self._serve.recv_multipart(zmq.NOBLOCK)
        except (zmq.Again, ValueError):
            return  # anything but a well-formed request is ignored
        if verb != CATCH_UP:
            return
        try:
            decoded = msgspec.msgpack.decode(anchor_bytes) if anchor_bytes else None
            anchor = (str(decoded[0]), int(decoded[1]), int(decoded[2])) if decoded is not None else None
        except (msgspec.DecodeError, TypeError, ValueError, IndexError, KeyError):
            return
        messages, found = self.after(anchor)
        for frames in messages:
            self._serve.send_multipart([ident, EVENT, *frames], copy=False)
        summary = msgspec.msgpack.encode({"num_messages": len(messages), "anchor_found": found})
        self._serve.send_multipart([ident, DONE, summary])
