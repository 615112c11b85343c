"""The PS's own bulk sockets: shards bind ROUTERs, pushers and pullers connect DEALERs.

Weight bytes never share a socket with the control bus. High-water marks are off on these sockets:
payloads are sent without copies, so a queued frame costs a reference to memory that exists anyway,
and dropping a frame (a ROUTER's reaction to a full queue) would stall a transfer. ROUTERs are
mandatory-routing so that a reply to a peer that went away fails loudly instead of vanishing.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

from psrl.ps import protocol
from psrl.ps.protocol import Message

LINGER_MS = 0


class LinkError(ConnectionError):
    """A frame could not be routed to its peer (it disconnected)."""


def make_router(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.bind(endpoint)
    return sock


def make_dealer(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 50)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
    sock.connect(endpoint)
    return sock


def send(sock: zmq.Socket[bytes], message: Message, payload: memoryview | None = None) -> None:
    """DEALER side: one message frame, then the payload frame (sent without a copy)."""
    header = protocol.encode(message)
    if payload is None:
        sock.send(header)
    else:
        sock.send_multipart([header, payload], copy=False)


def reply(sock: zmq.Socket[bytes], ident: bytes, message: Message, payload: memoryview | None = None) -> None:
    """ROUTER side: route ``message`` (and its payload) to ``ident``; LinkError if it is gone."""
    frames: list[bytes | memoryview] = [ident, protocol.encode(message)]
    if payload is not None:
        frames.append(payload)
    try:
        sock.send_multipart(frames, copy=False)
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EHOSTUNREACH:
            raise LinkError(f"peer {ident!r} is gone") from None
        raise


def split_frames(frames: Sequence[zmq.Frame], has_ident: bool) -> tuple[bytes, Message, zmq.Frame | None]:
    """(identity, message, payload) of a received multipart message; ProtocolError when malformed."""
    offset = 1 if has_ident else 0
    ident = frames[0].bytes if has_ident else b""
    if len(frames) < offset + 1:
        raise protocol.ProtocolError("empty message")
    message = protocol.decode(frames[offset].buffer)
    expects_payload = isinstance(message, protocol.WITH_PAYLOAD)
    num_expected = offset + (2 if expects_payload else 1)
    if len(frames) != num_expected:
        raise protocol.ProtocolError(f"{type(message).__name__} with {len(frames) - offset} frames")
    return ident, message, frames[offset + 1] if expects_payload else None
