"""Moving frames on and off sockets, with the fewest Python-level calls per message.

Per-message costs dominate a Python bus (the bytes themselves are cheap), so these helpers avoid
what pyzmq makes expensive: `Frame.more` replaces ``getsockopt(RCVMORE)``, polls go straight to
``zmq_poll`` without building a Poller, and a busy stream is read without polling at all.
"""

from __future__ import annotations

from typing import Any

import zmq

from bus.arrays import MAX_ARRAY_FRAMES

_MAX_FRAMES = 2 + MAX_ARRAY_FRAMES
_COPY_BELOW_BYTES = 64 * 1024
# Plain ints: or-ing pyzmq's flag enums costs microseconds per call.
SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)


def send_frames(socket: zmq.Socket[bytes], frames: list[Any], flags: int = 0) -> None:
    """Send one message: small frames copied, trailing array buffers without copying.

    `flags` (e.g. NOBLOCK) apply to the first frame; once it is accepted the rest cannot block.
    """
    last = len(frames) - 1
    socket.send(frames[0], SNDMORE | flags)
    socket.send(frames[1], SNDMORE if last > 1 else 0)
    for index in range(2, last + 1):
        socket.send(frames[index], SNDMORE if index < last else 0, copy=False)


def send_within(socket: zmq.Socket[bytes], frames: list[Any], timeout_ms: int) -> bool:
    """Send unless the socket cannot take the message within the timeout (False then).

    DEALER sockets block while they have no connected peer; nothing here waits forever.
    """
    try:  # normally a peer is connected and this succeeds without a poll
        send_frames(socket, frames, NOBLOCK)
    except zmq.Again:
        if not zmq.zmq_poll([(socket, _POLLOUT)], timeout_ms):
            return False
        send_frames(socket, frames)
    return True


def recv_event_frames(socket: zmq.Socket[bytes], flags: int = 0) -> list[Any]:
    """Receive one multipart message: frames below 64 KiB as bytes, larger ones as uncopied zmq.Frames.

    Frames beyond what an event may have are received and discarded (one extra is kept so the
    decoder reports the message as malformed), so a hostile sender cannot pile up frame objects.
    """
    first = socket.recv(flags, copy=False)  # flags apply to the first frame; the rest are already here
    frames: list[Any] = [first.bytes]
    more = first.more
    while more:
        frame = socket.recv(copy=False)
        more = frame.more
        if len(frames) <= _MAX_FRAMES:
            # small frames are cheaper as bytes (one short copy) than as zero-copy views
            frames.append(frame.bytes if len(frame) < _COPY_BELOW_BYTES else frame)
    return frames


def recv_within(socket: zmq.Socket[bytes], timeout_ms: int | None) -> list[Any] | None:
    """The next message's frames, waiting at most `timeout_ms` (None = forever); None on timeout."""
    if timeout_ms is not None and not zmq.zmq_poll([(socket, _POLLIN)], max(0, timeout_ms)):
        return None
    return recv_event_frames(socket)


class StreamReceiver:
    """Receives from one socket, skipping the poll while messages keep arriving back to back.

    A failed non-blocking receive costs more than a poll (pyzmq raises an exception), so the
    receiver only tries one while the previous attempt found a message waiting.
    """

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        self.socket = socket
        self._is_flowing = False

    def recv(self, timeout_ms: int | None) -> list[Any] | None:
        if self._is_flowing:
            try:
                return recv_event_frames(self.socket, NOBLOCK)
            except zmq.Again:
                self._is_flowing = False
        frames = recv_within(self.socket, timeout_ms)
        self._is_flowing = frames is not None
        return frames
