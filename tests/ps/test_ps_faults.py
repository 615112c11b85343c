"""Faults with real processes: shards killed mid-push, pullers killed mid-pull, stale trainers."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import torch
import zmq
from ps_helpers import Collector, assert_same, transport_params

from psrl.ps import LATEST, Puller, PullFailedError, Pusher, PushRefusedError
from psrl.ps.checksum import checksum
from psrl.ps.dtypes import byte_view
from psrl.ps.local import LocalShards
from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import PushBegin, ShardStatus, StatusRequest, decode, encode
from psrl.ps.transports.zmq_frames import ZmqPushDataPlane

BLOCK = 64 << 10


def model(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {f"layer.{i}.w": torch.randn(128, 256, generator=gen) for i in range(8)}


@pytest.fixture
def shards(sockdir: str) -> Iterator[LocalShards]:
    with LocalShards(sockdir, 2) as local:
        yield local


@pytest.fixture(params=transport_params(slow_unless_default=True))
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def status(endpoint: str) -> ShardStatus:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    try:
        sock.send(encode(StatusRequest(1)))
        if not sock.poll(10_000):
            raise TimeoutError(f"no status from {endpoint}")
        reply = decode(sock.recv())
        assert isinstance(reply, ShardStatus)
        return reply
    finally:
        sock.close(0)
        ctx.term()


def wait_for(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


class PausingPlane(ZmqPushDataPlane):
    """Test edge: on its first attempt to ``shard``, sends half the entries, then waits for ``resume``."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.paused = threading.Event()
        self.resume = threading.Event()

    def send(
        self,
        sock: zmq.Socket[bytes],
        begin: PushBegin,
        offer: bytes,
        payloads: Sequence[tuple[ManifestEntry, memoryview]],
    ) -> None:
        if begin.attempt > 1 or not payloads or payloads[0][0].shard != self.shard:
            super().send(sock, begin, offer, payloads)
            return
        half = len(payloads) // 2
        super().send(sock, begin, offer, payloads[:half])
        self.paused.set()
        assert self.resume.wait(30)
        super().send(sock, begin, offer, payloads[half:])


def run_push(pusher: Pusher, version: int, tensors: dict[str, torch.Tensor], out: list[object]) -> threading.Thread:
    def target() -> None:
        try:
            out.append(pusher.push(version, tensors))
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_shard_killed_mid_push_is_refilled_before_publication(shards: LocalShards) -> None:
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK, probe_interval_s=0.2)
    plane = PausingPlane(shard=1)
    pusher._plane = plane
    tensors = model(1)
    out: list[object] = []
    thread = run_push(pusher, 1, tensors, out)
    assert plane.paused.wait(30)
    wait_for(lambda: status(shards.pull_endpoints[1]).counters.get("incoming_landed", 0) > 0)
    shards.kill(1)
    shards.restart(1)
    puller = Puller(shards.pull_endpoints, timeout_s=5)
    with pytest.raises(PullFailedError):
        puller.pull(1, Collector())  # not published while a shard lacks it
    plane.resume.set()
    thread.join(60)
    result = out[0]
    assert not isinstance(result, Exception), result
    assert result.num_restarts >= 1  # type: ignore[attr-defined]
    got = Collector()
    assert puller.pull(LATEST, got).version == 1
    assert_same(got.tensors, tensors)
    pusher.close()
    puller.close()


class CommitGate(Pusher):
    """Test edge: holds the commit phase until ``resume`` is set."""

    acked = threading.Event()
    resume = threading.Event()

    def _commit_all(self, job):  # type: ignore[no-untyped-def]
        self.acked.set()
        assert self.resume.wait(30)
        super()._commit_all(job)


def test_shard_that_loses_a_prepared_version_is_refilled_before_commit(shards: LocalShards) -> None:
    pusher = CommitGate(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK, probe_interval_s=0.2)
    first = model(1)
    pusher.acked.set()
    pusher.resume.set()
    pusher.push(1, first)
    pusher.acked.clear()
    pusher.resume.clear()
    second = model(2)
    out: list[object] = []
    thread = run_push(pusher, 2, second, out)
    assert pusher.acked.wait(30)
    shards.kill(0)  # shard 0 held version 2 completely but had not committed it
    shards.restart(0)
    pusher.resume.set()
    thread.join(60)
    assert not isinstance(out[0], Exception), out[0]
    assert out[0].num_restarts >= 1  # type: ignore[attr-defined]
    puller = Puller(shards.pull_endpoints, timeout_s=5)
    got = Collector()
    assert puller.pull(LATEST, got).version == 2
    assert_same(got.tensors, second)
    pusher.close()
    puller.close()


def _pull_in_process(
    pull_endpoints: list[str], transport: str, version: int, delay_s: float, progress: object, out: object
) -> None:
    puller = Puller(pull_endpoints, transport=transport, timeout_s=10)

    def load(name: str, tensor: torch.Tensor) -> None:
        time.sleep(delay_s)
        progress.value += 1  # type: ignore[attr-defined]

    digests: dict[str, int] = {}
    result = puller.pull(version, lambda name, t: (load(name, t), digests.__setitem__(name, checksum(byte_view(t)))))
    out.put((result.version, digests))  # type: ignore[attr-defined]
    puller.close()


def test_puller_killed_mid_pull_restarts_and_pulls_again(sockdir: str, transport: str) -> None:
    with LocalShards(sockdir, 2, transport=transport) as shards:
        pusher = Pusher(shards.push_endpoints, incarnation=1, transport=transport, max_block_bytes=BLOCK)
        tensors = model(3)
        pusher.push(1, tensors)
        ctx = mp.get_context("spawn")
        progress, out = ctx.Value("i", 0), ctx.Queue()
        args = (shards.pull_endpoints, transport, 1, 0.5, progress, out)
        slow = ctx.Process(target=_pull_in_process, args=args)
        slow.start()
        wait_for(lambda: progress.value >= 1, timeout_s=60)
        slow.kill()
        slow.join(10)
        assert out.empty()
        pusher.push(2, model(4))  # the PS keeps serving pushes while a reader died mid-pull
        again = ctx.Process(target=_pull_in_process, args=(shards.pull_endpoints, transport, 1, 0.0, progress, out))
        again.start()
        version, digests = out.get(timeout=60)
        again.join(10)
        assert version == 1
        assert digests == {name: checksum(byte_view(t)) for name, t in tensors.items()}
        pusher.close()


def test_restarted_shard_is_refilled_by_the_next_push(sockdir: str, transport: str) -> None:
    with LocalShards(sockdir, 2, transport=transport) as shards:
        pusher = Pusher(shards.push_endpoints, incarnation=1, transport=transport, max_block_bytes=BLOCK)
        puller = Puller(shards.pull_endpoints, transport=transport, timeout_s=5)
        pusher.push(1, model(1))
        shards.kill(1)  # a crash after publication: version 1 is lost on shard 1
        shards.restart(1)
        with pytest.raises(PullFailedError):
            puller.pull(1, Collector())
        pusher.push(2, model(2))
        got = Collector()
        assert puller.sync(got, version=1).version == 2
        assert_same(got.tensors, model(2))
        pusher.close()
        puller.close()


def test_stale_trainer_incarnation_is_refused_mid_push(shards: LocalShards) -> None:
    zombie = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=BLOCK, timeout_s=20)
    plane = PausingPlane(shard=0)
    zombie._plane = plane
    out: list[object] = []
    thread = run_push(zombie, 1, model(5), out)
    assert plane.paused.wait(30)
    successor = Pusher(shards.push_endpoints, incarnation=2, max_block_bytes=BLOCK)
    successor.push(1, model(6))
    plane.resume.set()
    thread.join(60)
    assert isinstance(out[0], PushRefusedError), out[0]
    puller = Puller(shards.pull_endpoints, timeout_s=5)
    got = Collector()
    assert puller.pull(LATEST, got).version == 1
    assert_same(got.tensors, model(6))
    assert all(status(ep).max_incarnation == 2 for ep in shards.pull_endpoints)
    zombie.close()
    successor.close()
    puller.close()
