"""ZeroMQ multipart frames (the default transport): zero-copy sends, receives into warm buffers.

Push: every entry is a ``PushChunk`` frame plus a payload frame that views the trainer's tensor in
place; the shard receives the payload straight into the version's contiguous buffer. Pull: the shard
sends views of that buffer without copying, tracking each send, and the puller receives straight
into its own per-tensor buffers. Receiving into reused buffers matters: keeping received frames as
storage costs a page fault per 4 KiB of every new version and halves throughput. A retired buffer
is reused only once its tracked sends are done (see ``BufferPool``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import zmq

from psrl.ps import links
from psrl.ps.delta import SPARSE
from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import PullChunk, PullDone, PushBegin, PushChunk, ShardPullRequest
from psrl.ps.transports.base import (
    BufferPool,
    EntryBuffers,
    PullDataPlane,
    PushDataPlane,
    Replier,
    ShardDataPlane,
    SparseSource,
)


class ZmqShardDataPlane(ShardDataPlane):
    name: ClassVar[str] = "zmq"
    is_in_band: ClassVar[bool] = True

    def __init__(self) -> None:
        self.pool = BufferPool()

    def allocate(self, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        return self.pool.take(entries)

    def serve(
        self,
        reply: Replier,
        request: ShardPullRequest,
        entries: Sequence[ManifestEntry],
        buffers: EntryBuffers,
        sparse: SparseSource | None = None,
    ) -> None:
        for entry in entries:
            delta = sparse(entry) if sparse is not None else None
            if delta is not None:
                reply(PullChunk(request.request_id, request.version, entry.index, SPARSE, len(delta)), delta)
                continue
            tracker = reply(PullChunk(request.request_id, request.version, entry.index), buffers.view(entry.index))
            buffers.track(tracker)
        reply(PullDone(request.request_id, request.version), None)

    def release(self, buffers: EntryBuffers) -> None:
        self.pool.give(buffers)


class ZmqPushDataPlane(PushDataPlane):
    name: ClassVar[str] = "zmq"

    def send(
        self,
        sock: zmq.Socket[bytes],
        begin: PushBegin,
        offer: bytes,
        payloads: Sequence[tuple[ManifestEntry, memoryview]],
    ) -> None:
        for entry, view in payloads:
            header = PushChunk(begin.version, begin.incarnation, begin.attempt, entry.index)
            links.send(sock, header, view)


class ZmqPullDataPlane(PullDataPlane):
    name: ClassVar[str] = "zmq"
    is_in_band: ClassVar[bool] = True

    def request(
        self,
        sock: zmq.Socket[bytes],
        request: ShardPullRequest,
        offer: bytes,
        entries: Sequence[ManifestEntry],
        destinations: Sequence[memoryview],
    ) -> None:
        links.send(sock, request)
