"""Send hostile frames to one socket, from a process of its own: ``python -m psrl.reliability.sender
ADDRESS SOCKET_TYPE COUNT SEED MAX_MESSAGE_BYTES`` prints ``{"sent", "unsent", "oversized", "cut",
"seconds"}`` as JSON.

Light on purpose (zmq, msgspec and the bus's codec only): under load, a sender that imported the
launcher would take longer to start than a short run lasts.

An oversized frame goes on a connection of its own: the receiver's socket cuts a peer that sends
one (ZMQ_MAXMSGSIZE) before it allocates the frame, so the frame never reaches the receiver's
counters. The sender instead watches that connection and counts it ``cut`` once the receiver
closed it; an oversized frame not cut must be counted by the receiver like every other bad frame.
"""

from __future__ import annotations

import json
import os
import sys
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from psrl.reliability.hostile import HostileFrames

# Senders yield the CPU to the run: the fuzzer tests how actors handle hostile input, not whether
# nine busy senders on a 2-core machine can starve them of CPU (any local process could do that).
SENDER_NICENESS = 19
SEND_TIMEOUT_MS = 2000  # a peer that stops reading blocks a DEALER: give up on that frame instead
CLOSE_LINGER_MS = 30_000
CONNECT_WAIT_S = 0.2  # the connection (and, for a PUB, the proxy's subscriptions) comes up
CUT_WAIT_S = 30.0  # a starved (nice 19) sender may see the cut late; a cut itself takes milliseconds

Context = zmq.Context[zmq.Socket[bytes]]


def send_hostile(address: str, socket_type: int, count: int, seed: int, max_message_bytes: int) -> dict[str, float]:
    """Connect to ``address`` as a peer would and send ``count`` hostile frames (the sender process)."""
    ctx: Context = zmq.Context()
    sock = _connect(ctx, socket_type, address)
    sent = unsent = oversized = cut = 0
    started = time.monotonic()
    frames = HostileFrames(seed, max_message_bytes=max_message_bytes)
    for message in frames.frames(count):
        if frames.is_oversized(message):
            oversized += 1
            delivered, was_cut = _send_alone(ctx, socket_type, address, message)
            sent, unsent, cut = sent + delivered, unsent + (not delivered), cut + was_cut
            continue
        try:
            sock.send_multipart(message)
            sent += 1
        except zmq.Again:  # the receiver is not keeping up: backpressure, not a loss of the receiver's
            unsent += 1
    sock.close(linger=CLOSE_LINGER_MS)  # deliver what is queued: a frame never sent is not the receiver's to count
    ctx.term()
    seconds = time.monotonic() - started
    return {"sent": sent, "unsent": unsent, "oversized": oversized, "cut": cut, "seconds": seconds}


def _connect(ctx: Context, socket_type: int, address: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(socket_type)
    sock.sndtimeo = SEND_TIMEOUT_MS
    sock.connect(address)
    time.sleep(CONNECT_WAIT_S)
    return sock


def _send_alone(ctx: Context, socket_type: int, address: str, message: list[bytes]) -> tuple[bool, bool]:
    """Send ``message`` on a fresh connection; (sent, cut by the receiver)."""
    # a PUB drops what nobody subscribed to yet: an XPUB sees the proxy's subscription arrive first
    publishes = socket_type == zmq.PUB
    sock = ctx.socket(zmq.XPUB if publishes else socket_type)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.sndtimeo = SEND_TIMEOUT_MS
    sock.connect(address)
    if not publishes:
        time.sleep(CONNECT_WAIT_S)
    elif sock.poll(int(CUT_WAIT_S * 1000)):
        sock.recv()
    try:
        sock.send_multipart(message)
    except zmq.Again:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        return False, False
    was_cut = bool(monitor.poll(int(CUT_WAIT_S * 1000)))
    if was_cut:
        recv_monitor_message(monitor)
    sock.disable_monitor()
    monitor.close(0)
    sock.close(0 if was_cut else CLOSE_LINGER_MS)
    return True, was_cut


def main() -> None:
    os.nice(SENDER_NICENESS)
    address, kind, num, seed_arg, limit = sys.argv[1:6]
    print(json.dumps(send_hostile(address, int(kind), int(num), int(seed_arg), int(limit))))


if __name__ == "__main__":
    main()
