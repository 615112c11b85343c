"""Weight transports, chosen by ``psrl.ps.transport``; optional ones are imported on demand."""

from __future__ import annotations

from typing import Literal

from psrl.ps.transports.base import PullDataPlane, PushDataPlane, ShardDataPlane, TransportError

TransportName = Literal["zmq", "shm", "nixl", "torch_dist"]
TRANSPORTS: tuple[TransportName, ...] = ("zmq", "shm", "nixl", "torch_dist")


def shard_plane(name: str, host: str = "127.0.0.1") -> ShardDataPlane:
    if name == "zmq":
        from psrl.ps.transports.zmq_frames import ZmqShardDataPlane

        return ZmqShardDataPlane()
    if name == "shm":
        from psrl.ps.transports.shm import ShmShardDataPlane

        return ShmShardDataPlane()
    if name == "nixl":
        from psrl.ps.transports.nixl import NixlShardDataPlane

        return NixlShardDataPlane()
    if name == "torch_dist":
        from psrl.ps.transports.torch_dist import DistShardDataPlane

        return DistShardDataPlane(host=host)
    raise ValueError(f"unknown PS transport {name!r}; choose one of {TRANSPORTS}")


def push_plane(name: str, host: str = "127.0.0.1") -> PushDataPlane:
    if name == "zmq":
        from psrl.ps.transports.zmq_frames import ZmqPushDataPlane

        return ZmqPushDataPlane()
    if name == "shm":
        from psrl.ps.transports.shm import ShmPushDataPlane

        return ShmPushDataPlane()
    if name == "nixl":
        from psrl.ps.transports.nixl import NixlPushDataPlane

        return NixlPushDataPlane()
    if name == "torch_dist":
        from psrl.ps.transports.torch_dist import DistPushDataPlane

        return DistPushDataPlane(host=host)
    raise ValueError(f"unknown PS transport {name!r}; choose one of {TRANSPORTS}")


def pull_plane(name: str, host: str = "127.0.0.1", pin_memory: bool = False) -> PullDataPlane:
    """``pin_memory``: the puller feeds a CUDA engine (transports that map memory pin it)."""
    if name == "zmq":
        from psrl.ps.transports.zmq_frames import ZmqPullDataPlane

        return ZmqPullDataPlane()
    if name == "shm":
        from psrl.ps.transports.shm import ShmPullDataPlane

        return ShmPullDataPlane(pin_memory=pin_memory)
    if name == "nixl":
        from psrl.ps.transports.nixl import NixlPullDataPlane

        return NixlPullDataPlane()
    if name == "torch_dist":
        from psrl.ps.transports.torch_dist import DistPullDataPlane

        return DistPullDataPlane(host=host)
    raise ValueError(f"unknown PS transport {name!r}; choose one of {TRANSPORTS}")


def is_available(name: str) -> bool:
    """Whether the optional package a transport needs is installed."""
    if name == "nixl":
        try:
            import nixl._api  # noqa: F401
        except ImportError:
            return False
    return name in TRANSPORTS


__all__ = [
    "TRANSPORTS",
    "PullDataPlane",
    "PushDataPlane",
    "ShardDataPlane",
    "TransportError",
    "TransportName",
    "is_available",
    "pull_plane",
    "push_plane",
    "shard_plane",
]
