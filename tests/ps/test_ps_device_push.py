"""Pushes straight from the trainer's tensors into the shards' shared memory, checksums following
the bytes (``DeviceWeights``; on a GPU the copies are DMA into the shards' registered files, here the
same protocol runs from CPU tensors)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
import zmq
from ps_helpers import Collector, ThreadShards, assert_same, small_model

from psrl.ps import LATEST, Puller, PullFailedError, Pusher
from psrl.ps.checksum import WORD_SUM_MASK, checksum_and_word_sum, word_sum
from psrl.ps.local import LocalShards
from psrl.ps.manifest import ManifestEntry, build_manifest
from psrl.ps.protocol import PushBegin
from psrl.ps.staging import DeviceWeights, HostStaging, word_sum_on_device
from psrl.ps.transports import shm
from psrl.ps.transports.shm import ShmPushDataPlane
from psrl.ps.versions import ShardVersions

MakeShards = Callable[..., ThreadShards]
BLOCK = 16 << 10


def cast(model: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {name: t.to(dtype) if t.is_floating_point() else t for name, t in model.items()}


def test_a_device_push_lands_bit_exact_with_the_digest_of_a_staged_push(make_shards: MakeShards) -> None:
    model = small_model(3)
    shards = make_shards(2, "shm")
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport="shm", max_block_bytes=BLOCK)
    puller = Puller(shards.pull_endpoints, transport="shm", timeout_s=10)
    try:
        direct = pusher.push(1, DeviceWeights(model, torch.bfloat16))
        staged = HostStaging(cast_to=torch.bfloat16).stage(model)
        assert direct.digest == build_manifest(1, pusher.plan_for(staged), staged).digest()
        got = Collector()
        puller.pull(1, got)
        assert_same(got.tensors, cast(model, torch.bfloat16))
        assert sum(server.counters["checksum_failures"] for server in shards.servers) == 0
    finally:
        pusher.close()
        puller.close()


def test_consecutive_device_pushes_reuse_the_shards_files(make_shards: MakeShards) -> None:
    shards = make_shards(2, "shm")
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport="shm", max_block_bytes=BLOCK)
    puller = Puller(shards.pull_endpoints, transport="shm", timeout_s=10)
    try:
        for version in range(1, 6):
            assert pusher.push(version, DeviceWeights(small_model(version))).num_restarts == 0
        got = Collector()
        assert puller.pull(LATEST, got).version == 5
        assert_same(got.tensors, small_model(5))
    finally:
        pusher.close()
        puller.close()


def test_hosts_without_the_transport_are_told_to_stage(make_shards: MakeShards) -> None:
    shards = make_shards(1, "zmq")
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport="zmq")
    try:
        assert not pusher.copies_from_device
        with pytest.raises(ValueError, match="stage the weights"):
            pusher.push(1, DeviceWeights(small_model(0)))
    finally:
        pusher.close()


class HalfSendingPlane(ShmPushDataPlane):
    """Test edge: the first attempt to ``shard`` writes half its entries, as a trainer whose shard died."""

    def __init__(self, shard: int) -> None:
        super().__init__()
        self.shard = shard
        self.halted = threading.Event()

    def send_device(
        self, sock: zmq.Socket[bytes], begin: PushBegin, offer: bytes, entries: Sequence[ManifestEntry], weights: Any
    ) -> None:
        if begin.attempt == 1 and entries and entries[0].shard == self.shard:
            entries = entries[: len(entries) // 2]
            self.halted.set()
        super().send_device(sock, begin, offer, entries, weights)


def test_a_device_copy_that_lands_unlike_its_source_is_caught_and_sent_again(
    make_shards: MakeShards, monkeypatch: pytest.MonkeyPatch
) -> None:
    corrupted: set[int] = set()
    copy = shm._DeviceCopier.copy

    def copy_one_byte_wrong(self: Any, part: Sequence[tuple[ManifestEntry, memoryview]]) -> Any:
        """Test edge: the first bucket to each shard lands with one byte wrong (stale or misplaced bytes)."""
        landing = copy(self, part)
        entry, destination = part[0]
        if entry.shard not in corrupted:
            corrupted.add(entry.shard)
            destination[0] ^= 0xFF
        return landing

    monkeypatch.setattr(shm._DeviceCopier, "copy", copy_one_byte_wrong)
    model = small_model(5)
    shards = make_shards(2, "shm")
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport="shm", max_block_bytes=BLOCK)
    puller = Puller(shards.pull_endpoints, transport="shm", timeout_s=10)
    try:
        pushed = pusher.push(1, DeviceWeights(model))
        assert corrupted == {0, 1} and pushed.num_restarts == 2  # each shard's first attempt failed
        got = Collector()
        puller.pull(1, got)
        assert_same(got.tensors, model)
    finally:
        pusher.close()
        puller.close()


@pytest.mark.parametrize("start,end", [(0, 64), (0, 61), (3, 64), (5, 6), (8, 8), (1, 4099)])
def test_a_word_sum_taken_on_the_device_equals_the_hosts(start: int, end: int) -> None:
    source = torch.randint(0, 256, (4100,), dtype=torch.uint8)
    on_device = int(word_sum_on_device(source, start, end)) & WORD_SUM_MASK
    assert on_device == checksum_and_word_sum(source[start:end].numpy().tobytes())[1]


def test_a_shard_adopts_checksums_only_from_a_push_checked_at_its_source() -> None:
    checked: ShardVersions[str] = ShardVersions(0, 1)
    checked.begin(msgspec.structs.replace(deferred_begin(), source_checked=True), "buf")
    assert checked.incoming is not None and checked.incoming.source_checked
    plain: ShardVersions[str] = ShardVersions(0, 1)
    plain.begin(msgspec.structs.replace(deferred_begin(), checksums_follow=False, source_checked=True), "buf")
    assert plain.incoming is not None and not plain.incoming.source_checked  # its bytes came without checksums


def test_a_shard_killed_mid_device_push_is_refilled_before_publication(sockdir: str) -> None:
    model = small_model(7)
    with LocalShards(sockdir, 2, transport="shm") as shards:
        pusher = Pusher(shards.push_endpoints, incarnation=1, transport="shm", max_block_bytes=BLOCK,
                        probe_interval_s=0.2)  # fmt: skip
        pusher._plane.close()
        plane = HalfSendingPlane(shard=1)
        pusher._plane = plane
        out: list[object] = []
        thread = threading.Thread(target=lambda: out.append(pusher.push(1, DeviceWeights(model))))
        thread.start()
        puller = Puller(shards.pull_endpoints, transport="shm", timeout_s=5)
        try:
            assert plane.halted.wait(30)
            with pytest.raises(PullFailedError):
                puller.pull(1, Collector())  # never published while a shard lacks entries or the digest
            shards.kill(1)
            shards.restart(1)
            thread.join(60)
            assert out and getattr(out[0], "num_restarts", 0) >= 1, out
            got = Collector()
            assert puller.pull(LATEST, got).version == 1
            assert_same(got.tensors, model)
        finally:
            pusher.close()
            puller.close()


# the shard's rules for checksums that follow the bytes (pure state) ------------------------------------


def entry(index: int) -> ManifestEntry:
    return ManifestEntry(index, f"t{index}", (4,), "float32", 0, 0, 4, 64 * index, 16, 0)


def deferred_begin(entries: int = 2) -> PushBegin:
    items = tuple(entry(i) for i in range(entries))
    return PushBegin(1, 1, 1, b"", 1, entries, "xxh3_64", items, checksums_follow=True)


def test_a_deferred_push_is_not_landed_until_its_checksums_and_digest_came() -> None:
    state: ShardVersions[str] = ShardVersions(0, 1)
    state.begin(deferred_begin(), "buf")
    for index in (0, 1):
        matched = state.match_chunk(1, 1, 1, index)
        assert isinstance(matched, ManifestEntry)
        taken = state.take_checksum(matched, (100 + index,), 0)
        assert isinstance(taken, ManifestEntry) and taken.checksum == 100 + index
        state.mark_landed(index)
    assert state.incoming is not None and not state.incoming.is_landed  # the digest is still to come
    assert state.incoming.entries[1].checksum == 101
    assert state.seal(1, 1, 2, b"d") is not None  # another attempt's seal
    assert state.seal(1, 1, 1, b"d") is None
    assert state.incoming.is_landed and state.incoming.digest == b"d"


def test_checksums_must_come_exactly_when_the_begin_announced_them() -> None:
    deferred: ShardVersions[str] = ShardVersions(0, 1)
    deferred.begin(deferred_begin(), "buf")
    assert "without its checksum" in str(deferred.take_checksum(entry(0), (), 0))
    plain: ShardVersions[str] = ShardVersions(0, 1)
    plain.begin(msgspec.structs.replace(deferred_begin(), checksums_follow=False, digest=b"d"), "buf")
    assert "carried them" in str(plain.take_checksum(entry(0), (5,), 0))
    assert plain.take_checksum(entry(0), (), 0) == entry(0)
    assert plain.seal(1, 1, 1, b"d") is not None  # nothing to seal


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_push_is_copied_into_the_shards_files_and_pulled_bit_exact(make_shards: MakeShards) -> None:
    model = {name: t.cuda() for name, t in small_model(11, scale=3.0).items()}
    shards = make_shards(2, "shm")
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport="shm", max_block_bytes=BLOCK)
    puller = Puller(shards.pull_endpoints, transport="shm", timeout_s=10, pin_memory=True)
    try:
        for version in (1, 2, 3):
            for tensor in model.values():  # the trainer's step: the push must see this version's bytes
                if tensor.is_floating_point():
                    tensor.mul_(1.5)
                else:
                    tensor.add_(1)
            pushed = pusher.push_weights(version, model, HostStaging(cast_to=torch.bfloat16))
            got = Collector()
            puller.pull(version, got)
            assert_same(got.tensors, {n: t.cpu() for n, t in cast(model, torch.bfloat16).items()})
            assert pushed.num_restarts == 0
        assert sum(server.counters["checksum_failures"] for server in shards.servers) == 0
    finally:
        pusher.close()
        puller.close()


def test_a_large_entry_summed_in_pieces_while_hashed_gives_the_one_pass_result() -> None:
    data = np.random.default_rng(0).integers(0, 256, size=shm.SPLIT_SUM_BYTES + 4099, dtype=np.uint8)
    pool = ThreadPoolExecutor(max_workers=3)
    try:
        view = memoryview(data)
        assert shm._checksum_and_word_sum(view, pool) == checksum_and_word_sum(view)
        assert word_sum(view[:13]) == checksum_and_word_sum(view[:13])[1]
    finally:
        pool.shutdown()
