"""The shared-memory transport: pulls read the shard's mapped pages, files are cleaned up, and a
version retired during a mapped read fails the pull instead of loading it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import msgspec
import pytest
import torch
from ps_helpers import Collector, ThreadShards, assert_same, small_model

from psrl.ps.errors import PullFailedError
from psrl.ps.manifest import ManifestEntry
from psrl.ps.puller import Puller
from psrl.ps.pusher import Pusher
from psrl.ps.transports import TransportError
from psrl.ps.transports.base import EntryBuffers
from psrl.ps.transports.shm import (
    PREFIX,
    Segment,
    ShmPullDataPlane,
    ShmShardDataPlane,
    remove_stale_segments,
    shm_directory,
)

MakeShards = Callable[..., ThreadShards]


@pytest.fixture
def pair(make_shards: MakeShards) -> Iterator[tuple[ThreadShards, Pusher, Puller]]:
    shards = make_shards(2, "shm")
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport="shm", max_block_bytes=16 << 10, timeout_s=30)
    puller = Puller(shards.pull_endpoints, transport="shm", timeout_s=10)
    yield shards, pusher, puller
    pusher.close()
    puller.close()


def own_segments() -> set[str]:
    return {p.name for p in shm_directory().glob(f"{PREFIX}{os.getpid()}-*")}


def segment_mappings() -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of shard segment files."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if PREFIX in line:
            start, stop = line.split()[0].split("-")
            ranges.append((int(start, 16), int(stop, 16)))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_whole_tensors_are_handed_out_from_the_shards_mapped_memory(pair: tuple[ThreadShards, Pusher, Puller]) -> None:
    _, pusher, puller = pair
    model = small_model(0)
    pusher.push(1, model)
    mapped: dict[str, bool] = {}
    got = Collector()

    def load(name: str, tensor: torch.Tensor) -> None:
        mapped[name] = any(start <= tensor.data_ptr() < stop for start, stop in segment_mappings())
        got(name, tensor)

    result = puller.pull(1, load)
    assert_same(got.tensors, model)
    assert result.num_bytes == result.num_bytes_total
    split = {e.name for e in pusher.plan_for(model).entries if not e.is_whole_tensor}
    assert split and mapped == {name: name not in split for name in model}
    # Whole tensors are views of the mapped file: the puller's mirror holds only the split ones.
    assert puller.mirror.num_bytes == sum(model[n].numel() * model[n].element_size() for n in split)


def test_a_version_retired_during_a_mapped_read_fails_the_pull(pair: tuple[ThreadShards, Pusher, Puller]) -> None:
    _, pusher, puller = pair
    pusher.push(1, small_model(1))
    pushed_meanwhile: list[int] = []

    def load_while_the_trainer_moves_on(name: str, tensor: torch.Tensor) -> None:
        if not pushed_meanwhile:  # versions 2 and 3 commit while version 1 is being read: 1 is retired
            pushed_meanwhile.extend([pusher.push(2, small_model(2)).version, pusher.push(3, small_model(3)).version])

    with pytest.raises(PullFailedError, match="retired"):
        puller.pull(1, load_while_the_trainer_moves_on)
    assert puller.held_version == -1
    got = Collector()
    assert puller.sync(got).version == 3
    assert_same(got.tensors, small_model(3))


def test_delta_sync_over_shared_memory_reads_only_changed_entries(make_shards: MakeShards) -> None:
    shards = make_shards(2, "shm")
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport="shm", max_block_bytes=16 << 10)
    puller = Puller(shards.pull_endpoints, transport="shm", delta_sync=True)
    try:
        model = small_model(0)
        pusher.push(1, model)
        first = puller.pull(1, Collector())
        model["layer.0.b"] += 1
        pusher.push(2, model)
        got = Collector()
        second = puller.pull(2, got)
        assert second.num_bytes == model["layer.0.b"].numel() * 4 < first.num_bytes
        assert set(got.tensors) == {"layer.0.b"}
        assert all(torch.equal(puller.mirror.tensor(n), t) for n, t in model.items())
    finally:
        pusher.close()
        puller.close()


def test_shard_files_are_removed_when_retired_and_at_close(make_shards: MakeShards) -> None:
    before = own_segments()
    shards = make_shards(1, "shm")
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport="shm")
    puller = Puller(shards.pull_endpoints, transport="shm")
    try:
        for version in range(1, 8):
            pusher.push(version, small_model(version))
            puller.pull(version, Collector())
        # Latest, previous and at most two pooled spares stay; older versions' files are gone.
        assert len(own_segments() - before) <= 4
        # The puller keeps no mapping of a removed file (it would keep that memory alive).
        mapped = set(puller._plane._maps._maps)  # type: ignore[attr-defined]
        assert mapped and all(Path(path).exists() for path in mapped)
    finally:
        pusher.close()
        puller.close()
    shards.stop()
    assert own_segments() - before == set()


def test_files_of_dead_processes_are_removed_by_the_next_shard(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{PREFIX}{int(dead.stdout)}-0-deadbeef"
    stale.write_bytes(b"x" * 10)
    alive = tmp_path / f"{PREFIX}{os.getpid()}-0-cafecafe"
    alive.write_bytes(b"x")
    plane = ShmShardDataPlane(tmp_path)
    assert plane.num_stale_removed == 1 and not stale.exists() and alive.exists()
    assert remove_stale_segments(tmp_path) == 0


@pytest.mark.parametrize(
    ("offer", "message"),
    [
        (b"\x01\x02", "malformed"),
        (msgspec.msgpack.encode(["/etc/passwd", 10, {}]), "not a psrl segment"),
        (msgspec.msgpack.encode([f"/dev/shm/{PREFIX}1-1-gone", 10, {}]), "another host"),
    ],
)
def test_bad_offers_fail_with_a_clear_transport_error(offer: bytes, message: str) -> None:
    plane = ShmPullDataPlane()
    with pytest.raises(TransportError, match=message):
        plane.request(None, None, offer, [], [])  # type: ignore[arg-type]


def test_a_segment_larger_than_the_free_shared_memory_is_refused_clearly(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path)
    too_big = free.f_bavail * free.f_frsize + (1 << 40)
    with pytest.raises(TransportError, match="cannot reserve"):
        Segment(tmp_path, too_big)
    assert list(tmp_path.iterdir()) == []


def test_a_begin_sent_again_to_a_slow_shard_keeps_the_buffers_it_offered(
    make_shards: MakeShards, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pusher re-sends its begin after every quiet probe interval; the shard must not swap the
    # buffers it already offered, or the out-of-band bytes land where the shard no longer looks.
    allocate = ShmShardDataPlane.allocate

    def slow_allocate(self: ShmShardDataPlane, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        time.sleep(0.2)  # like reserving gigabytes of shared memory
        return allocate(self, entries)

    monkeypatch.setattr(ShmShardDataPlane, "allocate", slow_allocate)
    shards = make_shards(2, "shm")
    pusher = Pusher(
        shards.push_endpoints, incarnation=1, transport="shm", max_block_bytes=16 << 10, probe_interval_s=0.05
    )
    puller = Puller(shards.pull_endpoints, transport="shm")
    try:
        for version in (1, 2):
            assert pusher.push(version, small_model(version)).num_restarts == 0
        got = Collector()
        puller.pull(2, got)
        assert_same(got.tensors, small_model(2))
        assert sum(server.counters["checksum_failures"] for server in shards.servers) == 0
    finally:
        pusher.close()
        puller.close()
