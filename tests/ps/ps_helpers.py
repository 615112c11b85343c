"""Helpers of the PS tests: shard servers in threads, small models, a collecting load callback."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from psrl.ps.local import ipc_endpoints
from psrl.ps.shard import ShardOptions, ShardServer, VersionEvent
from psrl.ps.transports import TRANSPORTS, is_available


def transport_params(slow_unless_default: bool = False) -> list[object]:
    """Every transport; the optional ones skip when not installed.

    ``slow_unless_default`` marks all but the default transport ``slow`` (process-heavy tests).
    """
    params = []
    for name in TRANSPORTS:
        marks = [pytest.mark.skipif(not is_available(name), reason=f"{name} is not installed")]
        if slow_unless_default and name != "zmq":
            marks.append(pytest.mark.slow)
        params.append(pytest.param(name, marks=marks))
    return params


class ThreadShards:
    """K real shard servers (real sockets), each served by a thread of this process."""

    def __init__(self, directory: str, num_shards: int, transport: str = "zmq", serve_dtype: str | None = None):
        self.push_endpoints, self.pull_endpoints = ipc_endpoints(directory, num_shards)
        self.servers: list[ShardServer] = []
        self.commits: list[tuple[int, int]] = []  # (shard, version) in commit order
        self.events: list[tuple[str, VersionEvent]] = []  # ("stored" | "commit", event) in order
        self._threads: list[tuple[threading.Thread, threading.Event]] = []
        self._lock = threading.Lock()
        for i in range(num_shards):
            options = ShardOptions(
                i, num_shards, self.push_endpoints[i], self.pull_endpoints[i], transport, serve_dtype
            )
            server = ShardServer(options, on_commit=self._hook(i), on_stored=self._stored)
            self.servers.append(server)
            self._threads.append(server.start_thread())

    def _hook(self, shard: int) -> Callable[[VersionEvent], None]:
        def on_commit(event: VersionEvent) -> None:
            assert event.shard == shard
            with self._lock:
                self.commits.append((shard, event.version))
                self.events.append(("commit", event))

        return on_commit

    def _stored(self, event: VersionEvent) -> None:
        with self._lock:
            self.events.append(("stored", event))

    def stop(self) -> None:
        for thread, stop in self._threads:
            stop.set()
            thread.join(10)


def small_model(seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A few tensors of mixed sizes and dtypes, one of them large enough to be split into blocks."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(300, 64, generator=gen) * scale,
        "layer.0.w": torch.randn(64, 64, generator=gen) * scale,
        "layer.0.b": torch.randn(64, generator=gen) * scale,
        "layer.1.w": torch.randn(64, 48, generator=gen).to(torch.bfloat16),
        "steps": torch.arange(7, dtype=torch.int64) + seed,
        "norm.weight": torch.ones(64) * (1 + seed),
    }


class Collector:
    """A load callback that keeps copies of what it was given."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.num_calls = 0

    def __call__(self, name: str, tensor: torch.Tensor) -> None:
        self.num_calls += 1
        self.tensors[name] = tensor.clone()


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name
