"""Typed point-to-point links between actors (ROUTER on the serving side, DEALER on the other).

Requests, token streams and results between coordinator, router, rollout instances and trainer
travel on these links, not on the pub/sub bus: they are addressed to one peer and ordered per
peer. Messages use the bus codec and envelopes (sender ``<actor>.link``, so the published event
stream keeps its own gap-free numbering). Undecodable messages are counted and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

from bus.codec import Decoder, Encoder
from bus.drops import DropCounter
from bus.errors import DecodeError
from bus.io import recv_event_frames, send_frames
from bus.schema import Envelope, Event, Message
from bus.settings import BusSettings
from bus.sockets import make_socket
from bus.stamp import Stamper


class Link:
    """One end of a link: ``serve=True`` binds a ROUTER, otherwise a DEALER connects as ``identity``."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        address: str,
        *,
        sender: str,
        incarnation: int,
        settings: BusSettings,
        serve: bool,
        identity: str | None = None,
    ) -> None:
        self.is_server = serve
        socket_type = zmq.ROUTER if serve else zmq.DEALER
        ident = identity.encode() if identity is not None else None
        self.socket = make_socket(ctx, socket_type, address, options=settings.options, bind=serve, identity=ident)
        if serve:
            self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted peer takes its name back
            self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises
        self.stamper = Stamper(f"{sender}.link", incarnation)
        self.encoder = Encoder(settings.array_frame_bytes)
        self.decoder = Decoder(settings.max_message_bytes)
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
        stamped = self.stamper.stamp(message, parent, model_version, request_id, prompt_id)
        return stamped if self._send_frames(self.encoder.encode(stamped, message), to) else None

    def send_many(self, messages: Sequence[Message], to: str | None = None) -> bool:
        """Send several messages of one kind as one ZeroMQ message (one envelope each)."""
        events = [(self.stamper.stamp(m), m) for m in messages]
        return self._send_frames(self.encoder.encode_batch(events), to)

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

        A message that cannot be decoded is counted in `drops` and gives no events.
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
