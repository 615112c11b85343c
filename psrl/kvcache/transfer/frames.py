"""The target's side of a ``tcp`` reply's frames of blocks: read straight into the tier's room.

A reply is one ZeroMQ message: the head, then the blocks back to back in one frame per run the
source found adjacent. The target reserved room for the piece when it asked (as for NIXL) and
receives each frame into it with ``recv_into``: ZeroMQ's receive copies the frame into the tier
and frees its own buffer at once, so the next frame of the same size reuses memory the allocator
already has. Holding the frames until the piece had been copied out of them cost a fresh buffer
per frame, page faults and kernel zeroing included: half the wire's throughput on loopback.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import zmq


class FramesError(ValueError):
    pass


def drain(sock: zmq.Socket[Any]) -> None:
    """Drop the rest of a message whose head was read (a reply nobody waits for any more)."""
    while sock.getsockopt(zmq.RCVMORE):
        sock.recv(copy=False, flags=zmq.NOBLOCK)


def receive_into(sock: zmq.Socket[Any], store: Any, reservation: Any, num_blocks: int, block_bytes: int) -> None:
    """Read the frames after a reply's head into the first ``num_blocks`` allocations of
    ``reservation`` (in order): into one view of them when they lie back to back, else frame by
    frame through a copy. Raises FramesError when the frames do not hold exactly those blocks."""
    expected = num_blocks * block_bytes
    room = store.reserved_view(reservation, num_blocks)
    target = None if room is None else room.numpy()
    offset = 0
    while sock.getsockopt(zmq.RCVMORE):
        if target is not None:
            size = sock.recv_into(target[offset:], flags=zmq.NOBLOCK)  # truncated (and reported) if too long
        else:
            frame = sock.recv(copy=False, flags=zmq.NOBLOCK)
            size = len(frame.buffer)
            if size <= expected - offset and size % block_bytes == 0:
                store.write_reserved(reservation, offset // block_bytes, rows_of(frame, block_bytes))
        if size > expected - offset or size % block_bytes:
            drain(sock)
            raise FramesError(f"{num_blocks} blocks of {block_bytes} bytes announced, a frame of {size} received")
        offset += size
    if offset != expected:
        raise FramesError(f"{num_blocks} blocks of {block_bytes} bytes announced, {offset} bytes received")


def rows_of(frame: Any, block_bytes: int) -> torch.Tensor:
    with warnings.catch_warnings():  # a read-only frame: copied out of before it goes
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(frame.buffer, dtype=torch.uint8).view(-1, block_bytes)
