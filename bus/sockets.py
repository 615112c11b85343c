"""The one place where bus sockets are created.

`make_socket` sets high-water marks, linger, identity and CURVE, and binds or connects. Every
socket of a run is made here: the proxies', the publishers' and subscribers', the links' and the
parameter server's bulk sockets, so CURVE (across hosts) applies to all of them. Which of
the two it does follows the socket's role unless told otherwise: the stable ends (proxy XSUB and
XPUB, request ROUTERs) bind, the actors' ends (publishers, subscribers, DEALERs) connect.

Back-pressure: every send on the event path is non-blocking by construction. PUB/XPUB sockets
drop a message for a subscriber whose queue is at its high-water mark instead of waiting, so a
slow subscriber loses events (and detects it from sequence numbers), but never slows anyone else.

Memory: a queue holds at most its high-water mark in messages, and with ``max_frame_bytes`` set
libzmq cuts a peer whose frame is larger before it allocates the frame (ZMQ_MAXMSGSIZE), so no
peer can make a receiver hold more than high-water mark x frame limit per connection. Without the
limit an oversized frame would be received whole and only then dropped by the codec: a flood of
them, fanned out by the proxies to every subscriber, grew every actor by gigabytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import zmq

from bus.errors import BusError
from bus.security import CurveKeys, apply_curve

_BINDS_BY_DEFAULT: dict[int, bool] = {
    zmq.XSUB: True,
    zmq.XPUB: True,
    zmq.ROUTER: True,
    zmq.PUB: False,
    zmq.SUB: False,
    zmq.DEALER: False,
    zmq.PAIR: True,
}


@dataclass(frozen=True)
class SocketOptions:
    """Settings shared by the run's sockets (from the `bus` config section)."""

    hwm: int = 100_000
    linger_ms: int = 0
    curve: CurveKeys | None = None
    max_frame_bytes: int = -1  # ZMQ_MAXMSGSIZE: a peer sending a larger frame is disconnected; -1: no limit
    rcvhwm: int | None = None  # a receive high-water mark apart from ``hwm`` (None: the same)


DEFAULT_SOCKET_OPTIONS = SocketOptions()


def make_socket(
    ctx: zmq.Context[zmq.Socket[bytes]],
    socket_type: int,
    address: str,
    *,
    options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
    bind: bool | None = None,
    identity: bytes | None = None,
    linger_ms: int | None = None,
    subscribe: Sequence[bytes] = (),
    sockopts: Mapping[int, int] | None = None,
) -> zmq.Socket[bytes]:
    """Create, configure and bind or connect one socket. Raises BusError with the address on failure.

    ``sockopts``: further integer options (e.g. ROUTER_MANDATORY), set before it binds or connects.
    """
    is_bind = _BINDS_BY_DEFAULT.get(socket_type, False) if bind is None else bind
    socket = ctx.socket(socket_type)
    try:
        socket.sndhwm = options.hwm
        socket.rcvhwm = options.hwm if options.rcvhwm is None else options.rcvhwm
        socket.setsockopt(zmq.MAXMSGSIZE, options.max_frame_bytes)
        socket.linger = options.linger_ms if linger_ms is None else linger_ms
        if identity is not None:
            socket.identity = identity
        if options.curve is not None and not address.startswith("inproc://"):
            apply_curve(socket, options.curve, is_server=is_bind)
        for prefix in subscribe:
            socket.setsockopt(zmq.SUBSCRIBE, prefix)
        for option, value in (sockopts or {}).items():
            socket.setsockopt(option, value)
        if is_bind:
            socket.bind(address)
        else:
            socket.connect(address)
    except zmq.ZMQError as exc:
        socket.close(0)
        verb = "bind" if is_bind else "connect"
        raise BusError(f"cannot {verb} {_type_name(socket_type)} socket to {address}: {exc}") from exc
    return socket


def bound_address(socket: zmq.Socket[bytes]) -> str:
    """The concrete address a socket bound (resolves ``tcp://host:*`` to the chosen port)."""
    endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
    if not isinstance(endpoint, bytes):
        raise BusError("socket has no bound endpoint")
    return endpoint.decode()


def _type_name(socket_type: int) -> str:
    return zmq.SocketType(socket_type).name
