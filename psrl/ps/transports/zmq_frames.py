"""ZeroMQ multipart frames, zero-copy both ways (the default transport).

Push: every entry is a ``PushChunk`` frame plus a payload frame that views the trainer's tensor;
the shard keeps the received frame itself as the entry's storage, so a version's bytes are copied
only by the kernel. Pull: the shard sends views of its stored frames (or of its cast buffer), and
the puller hands out tensors that view the received frames. Memory is reference counted end to
end: a retired version's buffers live exactly as long as frames still queued for a slow reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import zmq

from psrl.ps import links
from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import ProtocolError, PullChunk, PullDone, PullRequest, PushBegin, PushChunk
from psrl.ps.transports.base import EntryBuffers, PullDataPlane, PushDataPlane, Replier, ShardDataPlane


def _frame_bytes(entry: ManifestEntry, frame: zmq.Frame) -> memoryview:
    view = frame.buffer
    if len(view) != entry.num_bytes:
        raise ProtocolError(f"entry {entry.index}: {len(view)} bytes, expected {entry.num_bytes}")
    return view


class ZmqShardDataPlane(ShardDataPlane):
    name: ClassVar[str] = "zmq"
    is_in_band: ClassVar[bool] = True

    def allocate(self, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        return EntryBuffers()

    def accept_payload(self, buffers: EntryBuffers, entry: ManifestEntry, frame: zmq.Frame) -> memoryview:
        view = _frame_bytes(entry, frame)
        buffers.views[entry.index] = view
        return view

    def serve(
        self, reply: Replier, request: PullRequest, entries: Sequence[ManifestEntry], buffers: EntryBuffers
    ) -> None:
        for entry in entries:
            reply(PullChunk(request.request_id, request.version, entry.index), buffers.view(entry.index))
        reply(PullDone(request.request_id, request.version), None)


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

    def request(
        self, sock: zmq.Socket[bytes], request: PullRequest, offer: bytes, entries: Sequence[ManifestEntry]
    ) -> None:
        links.send(sock, request)

    def accept_payload(self, entry: ManifestEntry, frame: zmq.Frame) -> memoryview:
        return _frame_bytes(entry, frame)
