"""Send hostile frames to one socket, from a process of its own: ``python -m psrl.reliability.sender
ADDRESS SOCKET_TYPE COUNT SEED MAX_MESSAGE_BYTES`` prints ``{"sent", "unsent", "seconds"}`` as JSON.

Light on purpose (zmq, msgspec and the bus's codec only): under load, a sender that imported the
launcher would take longer to start than a short run lasts.
"""

from __future__ import annotations

import json
import os
import sys
import time

import zmq

from psrl.reliability.hostile import HostileFrames

# Senders yield the CPU to the run: the fuzzer tests how actors handle hostile input, not whether
# nine busy senders on a 2-core machine can starve them of CPU (any local process could do that).
SENDER_NICENESS = 19
SEND_TIMEOUT_MS = 2000  # a peer that stops reading blocks a DEALER: give up on that frame instead
CLOSE_LINGER_MS = 30_000


def send_hostile(address: str, socket_type: int, count: int, seed: int, max_message_bytes: int) -> dict[str, float]:
    """Connect to ``address`` as a peer would and send ``count`` hostile frames (the sender process)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(socket_type)
    sock.sndtimeo = SEND_TIMEOUT_MS
    sock.connect(address)
    time.sleep(0.2)  # the connection (and, for a PUB, the proxy's subscriptions) comes up
    sent = unsent = 0
    started = time.monotonic()
    for message in HostileFrames(seed, max_message_bytes=max_message_bytes).frames(count):
        try:
            sock.send_multipart(message)
            sent += 1
        except zmq.Again:  # the receiver is not keeping up: backpressure, not a loss of the receiver's
            unsent += 1
    sock.close(linger=CLOSE_LINGER_MS)  # deliver what is queued: a frame never sent is not the receiver's to count
    ctx.term()
    return {"sent": sent, "unsent": unsent, "seconds": time.monotonic() - started}


def main() -> None:
    os.nice(SENDER_NICENESS)
    address, kind, num, seed_arg, limit = sys.argv[1:6]
    print(json.dumps(send_hostile(address, int(kind), int(num), int(seed_arg), int(limit))))


if __name__ == "__main__":
    main()
