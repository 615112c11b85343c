"""Request/reply over ROUTER/DEALER: timeouts, retries, correlation ids, duplicate suppression.

Frames: a request is an ordinary event (``[kind, body, *arrays]``) sent by a DEALER; the ROUTER
sees the peer identity in front of it. A reply is an event whose envelope ``parent`` is the
request's event id: that is the correlation id, so a client never takes a late reply to an
earlier request for the answer to the current one.

Retries resend the very same request (same event id) on a fresh socket ("lazy pirate"), so a
request queued to a dead peer is discarded rather than delivered twice later. The server keeps
the last requests by event id: a retried request that it already answered gets the same reply
again without running the handler twice, and one still being handled is not handed out again;
its reply goes to the socket that asked last.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import zmq

from bus.codec import DEFAULT_ARRAY_FRAME_BYTES, DEFAULT_MAX_MESSAGE_BYTES, Decoder, Encoder
from bus.drops import DropCounter
from bus.errors import DecodeError, RequestTimeoutError
from bus.io import SNDMORE, recv_within, send_frames, send_within
from bus.schema import Envelope, Event, Message
from bus.sockets import DEFAULT_SOCKET_OPTIONS, SocketOptions, bound_address, make_socket
from bus.stamp import Stamper


class Request(NamedTuple):
    """A received request: the peer to answer and the decoded event."""

    identity: bytes
    event: Event[Any]


@dataclass
class _Recent:
    """A recently received request: who asked last, and the reply once there is one."""

    identity: bytes
    reply_frames: list[Any] | None = None


class Replier:
    """The server side: a ROUTER that binds, receives requests and sends correlated replies."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        address: str,
        sender: str,
        incarnation: int = 0,
        *,
        options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
        bind: bool = True,
        num_cached_replies: int = 1024,
        array_frame_bytes: int = DEFAULT_ARRAY_FRAME_BYTES,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.socket = make_socket(ctx, zmq.ROUTER, address, options=options, bind=bind)
        self.address = bound_address(self.socket) if bind else address
        self.stamper = Stamper(sender, incarnation)
        self.drops = DropCounter(f"{sender}:router")
        self.num_duplicates = 0
        self._encoder = Encoder(array_frame_bytes)
        self._decoder = Decoder(max_message_bytes)
        self._recent: OrderedDict[str, _Recent] = OrderedDict()
        self._num_cached = num_cached_replies

    def recv(self, timeout_ms: int | None = None) -> Request | None:
        """The next new request; None when `timeout_ms` passes. Bad and duplicate ones are handled here."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        remaining = timeout_ms
        while (frames := recv_within(self.socket, remaining)) is not None:
            request = self._take_one(frames)
            if request is not None:
                return request
            if deadline is not None:  # a dropped or duplicate request does not restart the timeout
                remaining = max(0, int((deadline - time.monotonic()) * 1000))
        return None

    def _take_one(self, frames: list[Any]) -> Request | None:
        identity = frames[0]
        try:
            event = self._decoder.decode_one(frames[1:])
        except DecodeError as error:
            self.drops.record(error)
            return None
        event_id = event.envelope.event_id
        entry = self._recent.get(event_id)
        if entry is not None:
            self.num_duplicates += 1
            entry.identity = identity  # a retry comes from a fresh client socket: answer that one
            if entry.reply_frames is not None:
                self._send(identity, entry.reply_frames)
            return None
        self._recent[event_id] = _Recent(identity)
        while len(self._recent) > self._num_cached:
            self._recent.popitem(last=False)
        return Request(identity, event)

    def reply(self, request: Request, message: Message, *, model_version: int | None = None) -> Envelope:
        """Answer `request`; the reply's parent is the request's event id."""
        req = request.event.envelope
        request_event_id = req.event_id
        envelope = self.stamper.stamp(message, request_event_id, model_version, req.request_id, req.prompt_id)
        frames = self._encoder.encode(envelope, message)
        entry = self._recent.get(request_event_id)
        if entry is not None:
            entry.reply_frames = frames
            if entry.identity != request.identity:
                self._send(entry.identity, frames)
        self._send(request.identity, frames)
        return envelope

    def _send(self, identity: bytes, frames: list[Any]) -> None:
        self.socket.send(identity, SNDMORE)
        send_frames(self.socket, frames)

    def close(self) -> None:
        self.socket.close()


class Requester:
    """The client side: a DEALER connected to one Replier."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        address: str,
        sender: str,
        incarnation: int = 0,
        *,
        options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
        timeout_ms: int = 5000,
        retries: int = 2,
        array_frame_bytes: int = DEFAULT_ARRAY_FRAME_BYTES,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.address = address
        self.timeout_ms = timeout_ms
        self.retries = retries
        self.stamper = Stamper(sender, incarnation)
        self.drops = DropCounter(f"{sender}:dealer")
        self.num_stale_replies = 0
        self._ctx = ctx
        self._options = options
        self._encoder = Encoder(array_frame_bytes)
        self._decoder = Decoder(max_message_bytes)
        self.socket = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        return make_socket(self._ctx, zmq.DEALER, self.address, options=self._options, linger_ms=0)

    def call(
        self,
        message: Message,
        *,
        timeout_ms: int | None = None,
        retries: int | None = None,
        parent: str | None = None,
        model_version: int | None = None,
        request_id: int | None = None,
        prompt_id: int | None = None,
    ) -> Event[Any]:
        """Send a request and wait for its reply, retrying on timeout; raises RequestTimeoutError."""
        timeout = self.timeout_ms if timeout_ms is None else timeout_ms
        num_attempts = 1 + (self.retries if retries is None else retries)
        envelope = self.stamper.stamp(message, parent, model_version, request_id, prompt_id)
        frames = self._encoder.encode(envelope, message)
        for attempt in range(num_attempts):
            if attempt > 0:
                self.socket.close(0)
                self.socket = self._connect()
            deadline = time.monotonic() + timeout / 1000
            if send_within(self.socket, frames, timeout):
                remaining = max(0, int((deadline - time.monotonic()) * 1000))
                reply = self.recv_reply(envelope.event_id, remaining)
                if reply is not None:
                    return reply
        raise RequestTimeoutError(self.address, message.KIND, num_attempts, timeout)

    def send(
        self,
        message: Message,
        *,
        parent: str | None = None,
        model_version: int | None = None,
        request_id: int | None = None,
        prompt_id: int | None = None,
    ) -> Envelope:
        """Send without waiting for the reply (pipelined use); match replies by parent = this event id.

        Raises RequestTimeoutError if no peer can take the request within the timeout.
        """
        envelope = self.stamper.stamp(message, parent, model_version, request_id, prompt_id)
        if not send_within(self.socket, self._encoder.encode(envelope, message), self.timeout_ms):
            raise RequestTimeoutError(self.address, message.KIND, 1, self.timeout_ms)
        return envelope

    def recv_reply(self, correlation_id: str | None, timeout_ms: int) -> Event[Any] | None:
        """The next good reply (to `correlation_id` if given; others are counted stale and dropped)."""
        deadline = time.monotonic() + timeout_ms / 1000
        remaining = timeout_ms
        while (frames := recv_within(self.socket, remaining)) is not None:
            try:
                reply = self._decoder.decode_one(frames)
            except DecodeError as error:
                self.drops.record(error)
            else:
                if correlation_id is None or reply.envelope.parent == correlation_id:
                    return reply
                self.num_stale_replies += 1
            remaining = max(0, int((deadline - time.monotonic()) * 1000))
        return None

    def close(self) -> None:
        self.socket.close(0)
