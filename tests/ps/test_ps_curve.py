"""With the run's CURVE keys, a PS shard serves pushers and pullers holding them and refuses everyone else."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest
import torch

from bus.security import CurveKeys, generate_keys, load_keys
from psrl.ps import PullFailedError
from psrl.ps.puller import Puller
from psrl.ps.pusher import Pusher
from psrl.ps.shard import ShardOptions, ShardServer

WEIGHTS = {"layer.weight": torch.arange(64, dtype=torch.float32).reshape(8, 8), "layer.bias": torch.ones(8)}


@pytest.fixture
def keys(tmp_path: Path) -> CurveKeys:
    generate_keys(tmp_path / "keys")
    return load_keys(tmp_path / "keys")


def _free_ports(count: int) -> list[int]:
    """Ports free now (fixed ones collided with other tests' ephemeral ports under parallel runs)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture
def shard(keys: CurveKeys):  # type: ignore[no-untyped-def]
    push, pull = _free_ports(2)
    options = ShardOptions(0, 1, f"tcp://127.0.0.1:{push}", f"tcp://127.0.0.1:{pull}", curve=keys)
    server = ShardServer(options)
    thread, stop = server.start_thread()
    yield options
    stop.set()
    thread.join(5)
    server.close()


def test_authorized_clients_push_and_pull_and_a_stranger_is_refused(shard, keys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pusher = Pusher([shard.push_endpoint], incarnation=0, timeout_s=10, curve=keys)
    pusher.push(1, WEIGHTS)
    puller = Puller([shard.pull_endpoint], timeout_s=10, curve=keys)
    pulled: dict[str, torch.Tensor] = {}
    assert puller.pull(1, pulled.__setitem__).version == 1
    assert torch.equal(pulled["layer.weight"], WEIGHTS["layer.weight"])

    generate_keys(tmp_path / "other")
    stranger = dataclasses.replace(
        keys, client=load_keys(tmp_path / "other").client
    )  # knows the server, not authorized
    for client_keys in (stranger, None):  # unauthorized, and no CURVE at all
        intruder = Puller([shard.pull_endpoint], timeout_s=1, curve=client_keys)
        with pytest.raises(PullFailedError, match="refused the handshake"):
            intruder.pull(1, lambda name, tensor: None)
        intruder.close()
    for closable in (pusher, puller):
        closable.close()
