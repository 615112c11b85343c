"""torch.distributed broadcast (gloo) between a shard and one pusher or puller.

Each shard hosts a TCPStore. Every transfer gets its own two-rank gloo group, keyed by a name in
that store (``push-<boot>-<n>`` or the puller's ``pull-<id>-<request>``): rank 0 is the sender, which
broadcasts the requested entries one after the other, rank 1 receives them into its buffers.
Groups are built and driven on helper threads, so neither the shard's loop nor the pusher's waits
on a peer; entries the receiver completes are reported as landed. A failed or abandoned transfer
only costs its group (its peer times out); the next transfer uses a new one.

Only gloo is used: PS buffers live in host memory, and NCCL cannot send from host memory; a GPU
engine receives into host memory and copies to the device in its load callback.
"""

from __future__ import annotations

import datetime
import queue
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import torch
import torch.distributed as dist
import zmq
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from psrl.ps import links
from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import PullDone, PushBegin, ShardPullRequest
from psrl.ps.transports.base import (
    BufferPool,
    EntryBuffers,
    Landed,
    PullDataPlane,
    PushDataPlane,
    Replier,
    ShardDataPlane,
    SparseSource,
    TransportError,
)

GROUP_TIMEOUT_S = 60.0
MAX_PULL_LINKS = 256


class _Rendezvous(msgspec.Struct, array_like=True, frozen=True):
    host: str
    port: int
    key: str = ""


def _group(rendezvous: _Rendezvous, key: str, rank: int, store: Store | None = None) -> dist.ProcessGroupGloo:
    timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    if store is None:
        store = TCPStore(rendezvous.host, rendezvous.port, is_master=False, timeout=timeout)
    return dist.ProcessGroupGloo(PrefixStore(key, store), rank, 2, timeout)


def _as_bytes_tensor(view: memoryview) -> torch.Tensor:
    return torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)


def _broadcast(group: dist.ProcessGroupGloo, view: memoryview) -> None:
    if len(view) == 0:
        return  # both sides know the size; gloo needs no message for an empty entry
    options = dist.BroadcastOptions()
    options.rootRank = 0
    backend: Any = group  # the gloo backend's collectives are not in torch's type stubs
    backend.broadcast([_as_bytes_tensor(view)], options).wait()


class _DistWorker:
    """One helper thread running transfer jobs; jobs report landed entries or errors to queues."""

    def __init__(self, name: str, single_job: bool = False) -> None:
        self._single_job = single_job
        self.landed: queue.SimpleQueue[Landed] = queue.SimpleQueue()
        self.errors: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[tuple[object, ...] | None] = queue.SimpleQueue()
        self.num_active = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, *job: object) -> None:
        self.num_active += 1
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, *args = job
            try:
                fn(*args)  # type: ignore[operator]
            except Exception as exc:
                self.errors.put(f"{type(exc).__name__}: {exc}")
            finally:
                self.num_active -= 1
            if self._single_job:
                return

    def drain_landed(self) -> list[Landed]:
        out = []
        while True:
            try:
                out.append(self.landed.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._jobs.put(None)


class DistShardDataPlane(ShardDataPlane):
    name: ClassVar[str] = "torch_dist"
    is_in_band: ClassVar[bool] = False

    def __init__(self, host: str = "127.0.0.1") -> None:
        timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
        self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        self._rendezvous = _Rendezvous(host, self._store.port)
        self._boot = uuid.uuid4().hex[:8]
        # One thread per transfer: a peer that vanished blocks only its own thread until the group
        # times out, never the next push or another puller.
        self._workers: list[_DistWorker] = []
        # Pulls reuse one group per puller link (group setup costs a rendezvous); see DistPullDataPlane.
        self._links: dict[str, _DistWorker] = {}
        self._groups: dict[str, dist.ProcessGroupGloo] = {}
        self.pool = BufferPool()

    def _spawn(self, name: str) -> _DistWorker:
        self._workers = [w for w in self._workers if w.num_active or not w.landed.empty()]
        worker = _DistWorker(name, single_job=True)
        self._workers.append(worker)
        return worker

    def allocate(self, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        return self.pool.take(entries)

    def release(self, buffers: EntryBuffers) -> None:
        self.pool.give(buffers)

    def push_offer(self, buffers: EntryBuffers, begin: PushBegin, key: int) -> bytes:
        if not begin.entries:
            return b""
        group_key = f"push-{self._boot}-{key}"
        order = [(e.index, buffers.view(e.index)) for e in begin.entries]
        worker = self._spawn(group_key)
        worker.submit(self._receive, group_key, key, order, worker)
        return msgspec.msgpack.encode(_Rendezvous(self._rendezvous.host, self._rendezvous.port, group_key))

    def _receive(self, group_key: str, key: int, order: list[tuple[int, memoryview]], worker: _DistWorker) -> None:
        group = _group(self._rendezvous, group_key, rank=1, store=self._store)
        for index, view in order:
            _broadcast(group, view)
            worker.landed.put(Landed(key, index, view))

    def poll_landed(self) -> list[Landed]:
        out: list[Landed] = []
        for worker in self._workers:
            while not worker.errors.empty():
                worker.errors.get()  # the pusher sees its side fail (or the shard stay silent) and retries
            out.extend(worker.drain_landed())
        return out

    @property
    def is_busy(self) -> bool:
        return any(w.num_active for w in self._workers)

    def pull_offer(self, buffers: EntryBuffers) -> bytes:
        return msgspec.msgpack.encode(self._rendezvous)

    def serve(
        self,
        reply: Replier,
        request: ShardPullRequest,
        entries: Sequence[ManifestEntry],
        buffers: EntryBuffers,
        sparse: SparseSource | None = None,
    ) -> None:
        if not request.peer:
            raise TransportError("torch_dist pull request without a group key")
        views = [buffers.view(e.index) for e in entries]
        buffers.num_readers += 1  # the buffer is not reused while this send reads it
        self._link(request.peer).submit(self._send, request.peer, views, buffers)
        reply(PullDone(request.request_id, request.version), None)

    def _link(self, group_key: str) -> _DistWorker:
        """The thread serving one puller link; its requests run in order on one cached group."""
        worker = self._links.get(group_key)
        if worker is None:
            if len(self._links) >= MAX_PULL_LINKS:
                oldest = next(iter(self._links))
                self._links.pop(oldest).close()
                self._groups.pop(oldest, None)
            worker = self._links[group_key] = _DistWorker(f"ps-dist-{group_key}")
        return worker

    def _send(self, group_key: str, views: list[memoryview], buffers: EntryBuffers) -> None:
        try:
            group = self._groups.get(group_key)
            if group is None:
                group = self._groups[group_key] = _group(self._rendezvous, group_key, rank=0, store=self._store)
            for view in views:
                _broadcast(group, view)
        except Exception:
            self._groups.pop(group_key, None)  # the puller moves on to a new group key
            raise
        finally:
            buffers.num_readers -= 1

    def close(self) -> None:
        for worker in [*self._workers, *self._links.values()]:
            worker.close()


class DistPushDataPlane(PushDataPlane):
    name: ClassVar[str] = "torch_dist"

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._workers: dict[int, _DistWorker] = {}
        self._shard_of: dict[int, int] = {}

    def send(
        self,
        sock: zmq.Socket[bytes],
        begin: PushBegin,
        offer: bytes,
        payloads: Sequence[tuple[ManifestEntry, memoryview]],
    ) -> None:
        if not payloads:
            return
        rendezvous = msgspec.msgpack.decode(offer, type=_Rendezvous)
        shard = payloads[0][0].shard
        worker = self._workers.get(shard)
        if worker is None:
            worker = self._workers[shard] = _DistWorker(f"ps-dist-push-{shard}")
        worker.submit(self._send, rendezvous, [view for _, view in payloads])

    @staticmethod
    def _send(rendezvous: _Rendezvous, views: list[memoryview]) -> None:
        group = _group(rendezvous, rendezvous.key, rank=0)
        for view in views:
            _broadcast(group, view)

    def progress(self) -> list[int]:
        failed = []
        for shard, worker in self._workers.items():
            if not worker.errors.empty():
                worker.errors.get()
                failed.append(shard)
        return failed

    def cancel(self, shard: int) -> None:
        worker = self._workers.pop(shard, None)
        if worker is not None:
            worker.close()  # its current send ends when the group times out

    @property
    def is_busy(self) -> bool:
        return any(w.num_active for w in self._workers.values())

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()


@dataclass
class _PullLink:
    """One puller's transfers from one shard: a thread and, once built, a cached two-rank group."""

    worker: _DistWorker
    rendezvous: _Rendezvous | None = None
    group: dist.ProcessGroupGloo | None = None
    generation: int = 0
    active_request: int | None = None  # the request whose broadcasts are not all received yet


class DistPullDataPlane(PullDataPlane):
    name: ClassVar[str] = "torch_dist"
    is_in_band: ClassVar[bool] = False

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._id = uuid.uuid4().hex[:12]
        self._links: dict[int, _PullLink] = {}

    def request(
        self,
        sock: zmq.Socket[bytes],
        request: ShardPullRequest,
        offer: bytes,
        entries: Sequence[ManifestEntry],
        destinations: Sequence[memoryview],
    ) -> None:
        shard = entries[0].shard
        link = self._links.get(shard)
        if link is None:
            link = self._links[shard] = _PullLink(_DistWorker(f"ps-dist-pull-{shard}"))
        rendezvous = msgspec.msgpack.decode(offer, type=_Rendezvous)
        if link.rendezvous is None or (link.rendezvous.host, link.rendezvous.port) != (
            rendezvous.host,
            rendezvous.port,
        ):
            link.group, link.generation = None, link.generation + 1  # a new shard process: a new group
        key = f"pull-{self._id}-{shard}-{link.generation}"
        link.rendezvous = msgspec.structs.replace(rendezvous, key=key)
        links.send(sock, msgspec.structs.replace(request, peer=key))
        order = [(e.index, d) for e, d in zip(entries, destinations, strict=True)]
        link.active_request = request.request_id
        link.worker.submit(self._receive, link, link.rendezvous, request.request_id, order)

    @staticmethod
    def _receive(
        link: _PullLink, rendezvous: _Rendezvous, request_id: int, views: list[tuple[int, memoryview]]
    ) -> None:
        try:
            if link.group is None:
                link.group = _group(rendezvous, rendezvous.key, rank=1)
            for index, view in views:
                _broadcast(link.group, view)
                link.worker.landed.put(Landed(request_id, index, view))
            if link.active_request == request_id:
                link.active_request = None
        except Exception:
            # The group's broadcast sequence is broken: both sides move on to a new group key.
            link.group, link.rendezvous = None, None
            raise

    def poll_landed(self) -> list[Landed]:
        out: list[Landed] = []
        for link in self._links.values():
            if not link.worker.errors.empty():
                raise TransportError(f"torch_dist pull failed: {link.worker.errors.get()}")
            out.extend(link.worker.drain_landed())
        return out

    @property
    def is_busy(self) -> bool:
        return any(link.worker.num_active for link in self._links.values())

    def finish(self, request_id: int) -> None:
        """A pull ended; a link still waiting for its broadcasts (the pull failed) is abandoned.

        Its thread stays blocked until the group times out, so the next pull gets a new thread and
        a new group instead of queueing behind it.
        """
        for shard, link in list(self._links.items()):
            if link.active_request == request_id:
                link.worker.close()
                self._links[shard] = _PullLink(_DistWorker(f"ps-dist-pull-{shard}"), generation=link.generation + 1)

    @property
    def peer(self) -> str:
        return self._id

    def close(self) -> None:
        for link in self._links.values():
            link.worker.close()
