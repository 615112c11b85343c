"""The PS's own bulk sockets: shards bind ROUTERs, pushers and pullers connect DEALERs.

Weight bytes never share a socket with the control bus, but the sockets come from the bus's socket
factory (``bus.sockets.make_socket``): with the run's CURVE keys (across hosts) a shard refuses any
client whose key is not authorized, as every other socket of the run does. Sending high-water marks
are off on these sockets: payloads are sent without copies, so a queued frame costs a reference to
memory that exists anyway, and dropping a frame (a ROUTER's reaction to a full queue) would stall a
transfer. What a shard receives is bounded instead: at most ``SHARD_RCVHWM`` messages queued per
client (past it libzmq stops reading that client, which then waits: backpressure, nothing dropped)
and no frame larger than the shard's limit (its client is cut before the frame is allocated), so a
flood of frames cannot grow a shard's memory without bound. ROUTERs are mandatory-routing so that
a reply to a peer that went away fails loudly instead of vanishing.
"""

from __future__ import annotations

import zmq

from bus.security import CurveKeys
from bus.sockets import SocketOptions, make_socket
from psrl.ps import protocol
from psrl.ps.protocol import Message

LINGER_MS = 0
SHARD_RCVHWM = 1024
_RECONNECT: dict[int, int] = {zmq.RECONNECT_IVL: 50, zmq.RECONNECT_IVL_MAX: 500}


class LinkError(ConnectionError):
    """A frame could not be routed to its peer (it disconnected)."""


def _options(curve: CurveKeys | None) -> SocketOptions:
    return SocketOptions(hwm=0, linger_ms=LINGER_MS, curve=curve)


def make_router(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, curve: CurveKeys | None = None, max_frame_bytes: int = -1
) -> zmq.Socket[bytes]:
    """A shard's socket. With ``curve``, ``ctx`` needs a running authenticator (``start_authenticator``).

    ``max_frame_bytes``: the largest frame a client may send (a larger one cuts the client); -1: any.
    """
    options = SocketOptions(
        hwm=0, rcvhwm=SHARD_RCVHWM, linger_ms=LINGER_MS, curve=curve, max_frame_bytes=max_frame_bytes
    )
    return make_socket(ctx, zmq.ROUTER, endpoint, options=options, bind=True, sockopts={zmq.ROUTER_MANDATORY: 1})


def make_dealer(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, curve: CurveKeys | None = None
) -> zmq.Socket[bytes]:
    """A pusher's or puller's socket to one shard."""
    return make_socket(ctx, zmq.DEALER, endpoint, options=_options(curve), bind=False, sockopts=_RECONNECT)


def send(sock: zmq.Socket[bytes], message: Message, payload: memoryview | None = None) -> None:
    """DEALER side: one message frame, then the payload frame (sent without a copy)."""
    header = protocol.encode(message)
    if payload is None:
        sock.send(header)
    else:
        sock.send_multipart([header, payload], copy=False)


def reply(
    sock: zmq.Socket[bytes], ident: bytes, message: Message, payload: memoryview | None = None
) -> zmq.MessageTracker | None:
    """ROUTER side: route ``message`` (and its payload) to ``ident``; LinkError if it is gone.

    With a payload, returns the tracker that tells when libzmq no longer reads the payload's memory.
    """
    frames: list[bytes | memoryview] = [ident, protocol.encode(message)]
    try:
        if payload is None:
            sock.send_multipart(frames)
            return None
        frames.append(payload)
        return sock.send_multipart(frames, copy=False, track=True)
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EHOSTUNREACH:
            raise LinkError(f"peer {ident!r} is gone") from None
        raise


def recv_message(sock: zmq.Socket[bytes], has_ident: bool) -> tuple[bytes, Message] | None:
    """Identity and message of the next waiting multipart message, leaving its payload on the socket.

    None when nothing is waiting. A malformed message is discarded whole and raises ProtocolError.
    The caller must then take the payload (``recv_payload_into``) of messages in ``WITH_PAYLOAD``.
    """
    try:
        first = sock.recv(flags=zmq.NOBLOCK)
    except zmq.Again:
        return None
    ident = b""
    header = first
    if has_ident:
        if not _has_more(sock):
            raise protocol.ProtocolError("message without a body")
        ident, header = first, sock.recv()
    try:
        message = protocol.decode(header)
    except protocol.ProtocolError:
        discard_rest(sock)
        raise
    if isinstance(message, protocol.WITH_PAYLOAD) != _has_more(sock):
        discard_rest(sock)
        raise protocol.ProtocolError(f"{type(message).__name__} with a wrong number of frames")
    return ident, message


def recv_payload_into(sock: zmq.Socket[bytes], destination: memoryview) -> None:
    """Receive the pending payload frame straight into ``destination``; ProtocolError on a size mismatch."""
    received = sock.recv_into(destination) if len(destination) else len(sock.recv(copy=False).buffer)
    extra = _has_more(sock)
    discard_rest(sock)
    if received != len(destination) or extra:
        raise protocol.ProtocolError(f"payload of {received} bytes where {len(destination)} were expected")


def recv_payload_frame(sock: zmq.Socket[bytes], num_bytes: int) -> memoryview:
    """Receive the pending payload frame without a copy; its memory lives as long as the view."""
    frame = sock.recv(copy=False)
    extra = _has_more(sock)
    discard_rest(sock)
    view = frame.buffer
    if len(view) != num_bytes or extra:
        raise protocol.ProtocolError(f"payload of {len(view)} bytes where {num_bytes} were expected")
    return view


def discard_rest(sock: zmq.Socket[bytes]) -> int:
    """Drop the remaining frames of the current message; returns how many there were."""
    count = 0
    while _has_more(sock):
        sock.recv(copy=False)
        count += 1
    return count


def _has_more(sock: zmq.Socket[bytes]) -> bool:
    return bool(sock.getsockopt(zmq.RCVMORE))
