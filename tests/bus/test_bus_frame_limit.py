"""A socket with a frame limit cuts a peer that sends a larger frame before holding it; smaller frames pass."""

from __future__ import annotations

import torch
import zmq

from bus.sockets import SocketOptions, bound_address, make_socket
from psrl.config import load_config
from psrl.config.bus_settings import bus_settings
from psrl.ps.from_config import shard_options
from psrl.reliability.sender import send_hostile

LIMIT = 64 * 1024


def _router(ctx: zmq.Context) -> zmq.Socket:
    options = SocketOptions(max_frame_bytes=LIMIT)
    return make_socket(ctx, zmq.ROUTER, "tcp://127.0.0.1:*", options=options)


def _received(sock: zmq.Socket, timeout_ms: int = 2000) -> list[list[bytes]]:
    messages = []
    while sock.poll(timeout_ms):
        messages.append(sock.recv_multipart())
        timeout_ms = 200
    return messages


def test_an_oversized_frame_cuts_its_peer_and_never_arrives(ctx: zmq.Context) -> None:
    router = _router(ctx)
    address = bound_address(router)
    big = ctx.socket(zmq.DEALER)
    monitor = big.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    big.connect(address)
    big.send_multipart([b"x", b"\0" * (LIMIT + 1)])
    assert monitor.poll(5000), "the receiver did not cut a peer that sent a frame over its limit"
    small = ctx.socket(zmq.DEALER)
    small.connect(address)
    small.send_multipart([b"y", b"\0" * LIMIT])
    messages = _received(router)
    assert [m[1:] for m in messages] == [[b"y", b"\0" * LIMIT]]
    for sock in (big, monitor, small, router):
        sock.close(0)


def test_the_fuzz_sender_sees_every_oversized_frame_cut(ctx: zmq.Context) -> None:
    router = _router(ctx)
    counts = send_hostile(bound_address(router), zmq.DEALER, 2000, seed=4, max_message_bytes=LIMIT)
    assert counts["oversized"] == 2 and counts["cut"] == 2
    received = _received(router)
    assert len(received) == counts["sent"] - counts["cut"]
    assert all(sum(len(f) for f in m[1:]) <= LIMIT for m in received)
    router.close(0)


def test_a_runs_sockets_take_their_limits_from_the_config() -> None:
    config = load_config("demo", ["bus.max_message_mib=8", "psrl.ps.chunk_mb=32", "psrl.ps.transport=zmq"])
    assert bus_settings(config).options.max_frame_bytes == 8 << 20
    shard = shard_options(config, 0, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", engine_dtype=torch.float32)
    assert shard.max_frame_bytes == 32 << 20  # a payload is one block of a weight transfer
