"""A connection cut mid-handshake (a shard killed or restarting) is retried; a shard that cuts every one refuses."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from psrl.ps import PullFailedError
from psrl.ps.puller import Puller
from psrl.ps.pusher import Pusher
from psrl.ps.shard import ShardOptions, ShardServer
from psrl.ps.shard_links import VAGUE_FAILURES_TO_REFUSE

WEIGHTS = {"layer.weight": torch.arange(16, dtype=torch.float32).reshape(4, 4)}


def _cutting_listener(cuts: int | None) -> tuple[int, threading.Thread]:
    """A TCP port whose listener accepts and at once closes ``cuts`` connections (None: every one)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(10)

    def cut() -> None:
        done = 0
        with listener:
            while cuts is None or done < cuts:
                try:
                    conn, _ = listener.accept()
                except OSError:  # timed out: nobody connects any more
                    return
                conn.close()
                done += 1

    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    return int(listener.getsockname()[1]), thread


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_handshakes_cut_while_a_shard_restarts_do_not_fail_the_pull() -> None:
    pull_port, cutter = _cutting_listener(VAGUE_FAILURES_TO_REFUSE - 1)
    puller = Puller([f"tcp://127.0.0.1:{pull_port}"], timeout_s=10)
    cutter.join(10)
    assert not cutter.is_alive(), "the puller never connected"
    options = ShardOptions(0, 1, f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{pull_port}")
    server = ShardServer(options)
    thread, stop = server.start_thread()
    pusher = Pusher([options.push_endpoint], incarnation=0, timeout_s=10)
    try:
        pusher.push(1, WEIGHTS)
        pulled: dict[str, torch.Tensor] = {}
        assert puller.pull(1, pulled.__setitem__).version == 1
        assert torch.equal(pulled["layer.weight"], WEIGHTS["layer.weight"])
    finally:
        pusher.close()
        puller.close()
        stop.set()
        thread.join(5)
        server.close()


def test_a_peer_that_cuts_every_handshake_is_reported_long_before_the_timeout() -> None:
    pull_port, _ = _cutting_listener(None)
    puller = Puller([f"tcp://127.0.0.1:{pull_port}"], timeout_s=30)
    try:
        with pytest.raises(PullFailedError, match="refused the handshake: the handshake failed"):
            puller.pull(1, lambda name, tensor: None)
    finally:
        puller.close()
