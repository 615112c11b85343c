"""``psrl.ps.transport=auto``: shared memory when every actor is on one host and ``/dev/shm`` has room, else ZeroMQ.

Why: on one host a version pushed into the shards' shared memory and read from it in place costs what its bytes
cost, where ZeroMQ frames copy it through sockets twice: a 0.5B version's pull took 0.3-0.9 s over ZeroMQ in a
run on an H100 host against 10-30 ms from shared memory (docs/benchmarks.md). Shared memory cannot reach another
host, and a shard short of it would fail its pushes, so ``auto`` keeps ZeroMQ there.
"""

from __future__ import annotations

from dataclasses import dataclass

SHM_VERSIONS_HELD = 4  # a shard holds up to four versions of its part (psrl.ps.transports.shm)


@dataclass(frozen=True)
class TransportChoice:
    name: str
    reason: str


def choose_transport(setting: str, *, spans_hosts: bool, shm_free_bytes: int, version_bytes: int) -> TransportChoice:
    """The transport a run uses for ``setting``; an explicit one is kept as it is."""
    if setting != "auto":
        return TransportChoice(setting, "set")
    if spans_hosts:
        return TransportChoice("zmq", "the run spans hosts")
    needed = SHM_VERSIONS_HELD * version_bytes
    if shm_free_bytes < needed:
        return TransportChoice(
            "zmq",
            f"shared memory has {shm_free_bytes / 1e9:.2f} GB free, the shards may hold {needed / 1e9:.2f} GB "
            "(enlarge /dev/shm, docker: --shm-size, or set PSRL_SHM_DIR to a larger tmpfs)",
        )
    return TransportChoice("shm", "every actor on one host")
