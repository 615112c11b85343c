"""Point-to-point links between actors: a ROUTER on the serving side, a DEALER on each peer.

Requests, token streams, results and training data travel on links, not on the pub/sub bus: they
are addressed to one peer and ordered per peer. Every link socket is made by the socket factory
(``bus.sockets``), so CURVE applies to links as to the proxies. A serving link addresses its peers
by the identity they connect with (their actor names); a restarted peer takes its name back
(``ROUTER_HANDOVER``) and a send to a peer that is gone returns None instead of vanishing
(``ROUTER_MANDATORY``).

Link traffic is logged by the link itself: with a publisher (``log``) every message it sends of a
logged kind is also published, with the very envelope it was sent with, on the events proxy (as a
record, never as a command), so the event log holds what went over every link and a receiver's
``parent`` always names an event in the log. Kinds declared ``logged=False`` (the token stream, the
trainer's data) are numbered in a stream of their own (``<sender>.stream``), so the logged stream
(``<sender>.link``) stays gap-free. With a ``Cause``, every envelope names the event being handled
as its parent. Undecodable messages are counted and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

from bus.codec import DEFAULT_ARRAY_FRAME_BYTES, DEFAULT_MAX_MESSAGE_BYTES, Decoder, Encoder
from bus.drops import DropCounter
from bus.errors import DecodeError
from bus.io import recv_event_frames, send_frames
from bus.publisher import Publisher
from bus.schema import Envelope, Event, Message
from bus.sockets import DEFAULT_SOCKET_OPTIONS, SocketOptions, make_socket
from bus.stamp import Cause, Stamper


class Link:
    """One end of a link: ``serve=True`` binds a ROUTER, otherwise a DEALER connects as ``identity``."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        address: str,
        *,
        sender: str,
        incarnation: int = 0,
        serve: bool,
        identity: str | None = None,
        options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
        log: Publisher | None = None,
        cause: Cause | None = None,
        array_frame_bytes: int = DEFAULT_ARRAY_FRAME_BYTES,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.is_server = serve
        socket_type = zmq.ROUTER if serve else zmq.DEALER
        sockopts: dict[int, int] = {zmq.ROUTER_HANDOVER: 1, zmq.ROUTER_MANDATORY: 1} if serve else {}
        ident = identity.encode() if identity is not None else None
        self.socket = make_socket(
            ctx, socket_type, address, options=options, bind=serve, identity=ident, sockopts=sockopts
        )
        self.logged = Stamper(f"{sender}.link", incarnation, cause)
        self.unlogged = Stamper(f"{sender}.stream", incarnation, cause)
        self.log = log
        self.encoder = Encoder(array_frame_bytes)
        self.decoder = Decoder(max_message_bytes)
        self.drops = DropCounter(f"{sender}:link")
        self.num_unroutable = 0

    def send(
        self,
        message: Message,
        to: str | None = None,
        *,
        parent: str | None = None,
        model_version: int | None = None,
        request_id: int | None = None,
        prompt_id: int | None = None,
    ) -> Envelope | None:
        """Send to peer ``to`` (server side) or to the server (client side); None if the peer is gone."""
        stamper = self.logged if message.LOGGED else self.unlogged
        envelope = stamper.stamp(message, parent, model_version, request_id, prompt_id)
        frames = self.encoder.encode(envelope, message)
        if not self._send_frames(frames, to):
            stamper.take_back()
            return None
        if message.LOGGED and self.log is not None:
            self.log.forward(frames)
        return envelope

    def send_many(self, messages: Sequence[Message], to: str | None = None) -> bool:
        """Send several messages of one kind as one ZeroMQ message (one envelope each)."""
        logged = messages[0].LOGGED
        stamper = self.logged if logged else self.unlogged
        frames = self.encoder.encode_batch([(stamper.stamp(m), m) for m in messages])
        if not self._send_frames(frames, to):
            stamper.take_back(len(messages))
            return False
        if logged and self.log is not None:
            self.log.forward(frames)
        return True

    def _send_frames(self, frames: list[Any], to: str | None) -> bool:
        try:
            if self.is_server:
                if to is None:
                    raise ValueError("a serving link must name the peer to send to")
                self.socket.send(to.encode(), zmq.SNDMORE)
            send_frames(self.socket, frames)
        except zmq.error.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.num_unroutable += 1
            return False
        return True

    def recv(self) -> tuple[str, list[Event[Any]]] | None:
        """The next message waiting, as (peer name, its events); None if nothing waits.

        A message that cannot be decoded is counted in ``drops`` and gives no events.
        """
        if not self.socket.poll(0):
            return None
        peer = self.socket.recv().decode(errors="replace") if self.is_server else ""
        frames = recv_event_frames(self.socket)
        try:
            return peer, self.decoder.decode(frames)
        except DecodeError as error:
            self.drops.record(error)
            return peer, []

    def close(self) -> None:
        self.socket.close(0)
