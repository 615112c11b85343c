"""Shard snapshots: a shard SIGKILLed after a publication serves the same version again when restarted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import torch
from ps_helpers import Collector, assert_same, small_model, transport_params

from psrl.ps import LATEST, Puller, PullFailedError, Pusher
from psrl.ps.local import LocalShards, ipc_endpoints
from psrl.ps.shard import ShardOptions, ShardServer
from psrl.ps.snapshot import DATA_SUFFIX, SnapshotHeader, remove_snapshots

BLOCK = 4 << 10  # small blocks: the embedding is split, so a snapshot holds blocks of one tensor


@pytest.fixture(params=transport_params(slow_unless_default=True))
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def snapshots(tmp_path: Path) -> Path:
    return tmp_path / "ps"


class ThreadedShards:
    """Shard servers in threads of this process; ``restart`` drops one (nothing flushed) and starts anew."""

    def __init__(self, sockdir: str, snapshots: Path, serve_dtype: str | None = None) -> None:
        self.push_endpoints, self.pull_endpoints = ipc_endpoints(sockdir, 2)
        self.options = [
            ShardOptions(
                i,
                2,
                self.push_endpoints[i],
                self.pull_endpoints[i],
                serve_dtype=serve_dtype,
                snapshot_dir=str(snapshots),
            )
            for i in range(2)
        ]
        self.running = [self._start(i) for i in range(2)]

    def _start(self, shard: int) -> tuple[threading.Thread, threading.Event]:
        return ShardServer(self.options[shard]).start_thread()

    def restart(self, shard: int) -> None:
        self._stop(shard)
        self.running[shard] = self._start(shard)

    def _stop(self, shard: int) -> None:
        thread, stop = self.running[shard]
        stop.set()
        thread.join(10)

    def close(self) -> None:
        for shard in range(2):
            self._stop(shard)


@pytest.fixture
def threaded(sockdir: str, snapshots: Path) -> Iterator[Callable[..., ThreadedShards]]:
    made: list[ThreadedShards] = []

    def make(serve_dtype: str | None = None) -> ThreadedShards:
        made.append(ThreadedShards(sockdir, snapshots, serve_dtype))
        return made[-1]

    yield make
    for shards in made:
        shards.close()


def local_shards(sockdir: str, snapshots: Path, transport: str = "zmq", serve_dtype: str | None = None) -> LocalShards:
    shards = LocalShards(sockdir, 2, transport=transport, serve_dtype=serve_dtype)
    shards.with_options(snapshot_dir=str(snapshots))
    return shards


def pull_latest(shards: LocalShards | ThreadedShards, transport: str = "zmq") -> tuple[int, dict[str, torch.Tensor]]:
    puller = Puller(shards.pull_endpoints, transport=transport, timeout_s=5)
    try:
        got = Collector()
        version = puller.pull(LATEST, got).version
        return version, got.tensors
    finally:
        puller.close()


@pytest.fixture
def pusher_for() -> Iterator[list[Pusher]]:
    made: list[Pusher] = []
    yield made
    for pusher in made:
        pusher.close()


def test_every_shard_killed_after_publication_serves_the_version_again(
    sockdir: str, snapshots: Path, transport: str, pusher_for: list[Pusher]
) -> None:
    with local_shards(sockdir, snapshots, transport) as shards:
        pusher = Pusher(shards.push_endpoints, incarnation=1, transport=transport, max_block_bytes=BLOCK)
        pusher_for.append(pusher)
        pusher.push(1, small_model(1))
        pusher.push(2, small_model(2))
        for shard in (0, 1):
            shards.kill(shard)
        for shard in (0, 1):
            shards.restart(shard)
        version, tensors = pull_latest(shards, transport)
        assert version == 2
        assert_same(tensors, small_model(2))
        pusher.push(3, small_model(3))  # the restored version is committed: the next push is newer
        version, tensors = pull_latest(shards, transport)
        assert version == 3
        assert_same(tensors, small_model(3))
    data_files = sorted(p.name for p in snapshots.glob(f"*{DATA_SUFFIX}"))
    assert [name.split("-")[:3] for name in data_files] == [["ps", "0", "v3"], ["ps", "1", "v3"]]


def test_a_snapshot_keeps_the_served_dtype(threaded: Callable[..., ThreadedShards], pusher_for: list[Pusher]) -> None:
    shards = threaded(serve_dtype="bfloat16")
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK)
    pusher_for.append(pusher)
    pusher.push(1, small_model(4))
    _, before = pull_latest(shards)
    shards.restart(1)
    version, after = pull_latest(shards)
    assert version == 1
    assert after["embed.weight"].dtype == torch.bfloat16
    assert_same(after, before)


def test_a_torn_snapshot_is_ignored_and_the_next_push_refills_the_shard(
    threaded: Callable[..., ThreadedShards], snapshots: Path, pusher_for: list[Pusher]
) -> None:
    shards = threaded()
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK)
    pusher_for.append(pusher)
    pusher.push(1, small_model(5))
    (data,) = snapshots.glob(f"ps-0-*{DATA_SUFFIX}")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte: that entry fails its checksum
    data.write_bytes(bytes(raw))
    shards.restart(0)
    with pytest.raises(PullFailedError):
        pull_latest(shards)
    pusher.push(2, small_model(6))
    version, tensors = pull_latest(shards)
    assert version == 2
    assert_same(tensors, small_model(6))


def test_a_snapshot_of_another_layout_is_ignored(
    threaded: Callable[..., ThreadedShards], snapshots: Path, pusher_for: list[Pusher]
) -> None:
    shards = threaded()
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK)
    pusher_for.append(pusher)
    pusher.push(1, small_model(7))
    header_path = snapshots / "ps-1.committed"
    header = msgspec.msgpack.decode(header_path.read_bytes(), type=SnapshotHeader)
    header_path.write_bytes(msgspec.msgpack.encode(msgspec.structs.replace(header, num_shards=3)))
    shards.restart(1)
    with pytest.raises(PullFailedError):
        pull_latest(shards)


def test_superseded_versions_leave_no_files(
    threaded: Callable[..., ThreadedShards], snapshots: Path, pusher_for: list[Pusher]
) -> None:
    shards = threaded()
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK)
    pusher_for.append(pusher)
    for version in range(1, 5):
        pusher.push(version, small_model(version))
    names = sorted(p.name for p in snapshots.iterdir())
    assert [n for n in names if n.endswith(DATA_SUFFIX)] == [
        "ps-0-v4-i1-a1.data",
        "ps-1-v4-i1-a1.data",
    ]
    assert remove_snapshots(snapshots) == 4
    assert list(snapshots.iterdir()) == []


def test_a_header_that_cannot_be_written_leaves_the_version_served_and_the_shard_serving(
    threaded: Callable[..., ThreadedShards], snapshots: Path, pusher_for: list[Pusher]
) -> None:
    """A full disk, say: the snapshot is not kept, but the commit is answered and the version is served."""
    shards = threaded()
    (snapshots / "ps-0.tmp").mkdir(parents=True)  # where shard 0 writes its header first: the write fails
    # a shard that stopped answering would fail the push at its timeout rather than wait out the test's
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK, timeout_s=30)
    pusher_for.append(pusher)
    pusher.push(1, small_model(3))
    version, tensors = pull_latest(shards)
    assert version == 1
    assert_same(tensors, small_model(3))
    assert not (snapshots / "ps-0.committed").exists() and (snapshots / "ps-1.committed").exists()
    assert all(thread.is_alive() for thread, _ in shards.running)


def test_an_error_that_ends_the_serving_thread_is_kept_and_handed_to_the_host(sockdir: str) -> None:
    push, pull = ipc_endpoints(sockdir, 1)
    failures: list[Exception] = []
    server = ShardServer(ShardOptions(0, 1, push[0], pull[0]), on_failed=failures.append)

    def broken(timeout_ms: int | None = None) -> None:
        raise OSError(28, "No space left on device")

    server.poll_once = broken  # type: ignore[method-assign]
    thread, _ = server.start_thread()
    thread.join(10)
    assert not thread.is_alive()
    assert failures == [server.failure] and isinstance(server.failure, OSError)
