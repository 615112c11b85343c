"""NIXL one-sided transfers over UCX (DRAM to DRAM here; GPU memory where UCX supports it).

Needs the optional ``nixl`` package (extra ``kv``). Each shard, pusher and puller owns one NIXL
agent. A shard registers the contiguous buffer of every version it holds and advertises, in its
``PushReady`` and ``ManifestReply`` offers, the agent's metadata and the address of every entry.
Push: the pusher WRITEs its tensors' bytes straight into the shard's incoming buffer, then tells
the shard with ``PushWritten``; the shard verifies the entries like any others. Pull: the puller
READs the entries into its own registered buffer without involving the shard's loop; because a
one-sided read cannot see a version being retired, the puller confirms with a ``LiveCheck`` after
the read (and every entry is checked against its checksum anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec
import numpy as np
import zmq

from psrl.nixl_agents import make_agent
from psrl.ps import links
from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import PushBegin, PushWritten, ShardPullRequest
from psrl.ps.transports.base import (
    BufferPool,
    DirectAccessShardPlane,
    EntryBuffers,
    Landed,
    PullDataPlane,
    PushDataPlane,
    TransportError,
)

DRAM = "DRAM"
# Registrations are cached by (address, size) because weights and mirrors stay in place across
# transfers; past this many regions (the memory moved) they are dropped and rebuilt.
MAX_REGISTERED = 4096


class _NixlOffer(msgspec.Struct, array_like=True, frozen=True):
    agent: str
    metadata: bytes
    addresses: dict[int, tuple[int, int]]  # entry index -> (address, bytes)


def _agent(prefix: str) -> Any:
    return make_agent(prefix, "psrl.ps.transport=nixl")


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def _register(agent: Any, buffers: EntryBuffers) -> None:
    if buffers.backing is not None and buffers.backing.nbytes and buffers.handle is None:
        buffers.handle = agent.register_memory(
            [(int(buffers.backing.ctypes.data), buffers.backing.nbytes, 0, "")], DRAM
        )


def _register_region(agent: Any, registered: dict[tuple[int, int], Any], address: int, size: int) -> None:
    if (address, size) in registered:
        return
    if len(registered) >= MAX_REGISTERED:
        for handle in registered.values():
            agent.deregister_memory(handle)
        registered.clear()
    registered[(address, size)] = agent.register_memory([(address, size, 0, "")], DRAM)


def _start(
    agent: Any, op: str, local: list[tuple[int, int, int]], remote: list[tuple[int, int, int]], peer: str
) -> Any:
    handle = agent.initialize_xfer(op, agent.get_xfer_descs(local, DRAM), agent.get_xfer_descs(remote, DRAM), peer)
    if agent.transfer(handle) == "ERR":
        agent.release_xfer_handle(handle)
        raise TransportError(f"NIXL {op} to {peer} failed to start")
    return handle


def _state(agent: Any, handle: Any) -> str:
    state = agent.check_xfer_state(handle)
    if state in ("DONE", "ERR"):
        agent.release_xfer_handle(handle)
    return str(state)


class NixlShardDataPlane(DirectAccessShardPlane):
    name: ClassVar[str] = "nixl"

    def __init__(self) -> None:
        self._agent = _agent("psrl-ps")
        # Retired buffers stay registered while pooled; one-sided reads of a version retired meanwhile
        # are caught by the puller's checksums and its live check.
        self.pool = BufferPool()

    def allocate(self, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        buffers = self.pool.take(entries)
        _register(self._agent, buffers)
        return buffers

    def _offer(self, buffers: EntryBuffers) -> bytes:
        addresses = {i: (buffers.address(i), len(v)) for i, v in buffers.views.items() if len(v)}
        offer = _NixlOffer(self._agent.name, self._agent.get_agent_metadata(), addresses)
        return msgspec.msgpack.encode(offer)

    def release(self, buffers: EntryBuffers) -> None:
        for evicted in self.pool.give(buffers):
            if evicted.handle is not None:
                self._agent.deregister_memory(evicted.handle)
                evicted.handle = None


class NixlPushDataPlane(PushDataPlane):
    name: ClassVar[str] = "nixl"

    def __init__(self) -> None:
        self._agent = _agent("psrl-pusher")
        self._registered: dict[tuple[int, int], Any] = {}  # trainer memory stays registered across pushes
        self._pending: dict[int, tuple[Any, zmq.Socket[bytes], PushBegin, tuple[int, ...]]] = {}

    def send(
        self,
        sock: zmq.Socket[bytes],
        begin: PushBegin,
        offer: bytes,
        payloads: Sequence[tuple[ManifestEntry, memoryview]],
    ) -> None:
        if not payloads:
            return
        remote = msgspec.msgpack.decode(offer, type=_NixlOffer)
        self._agent.add_remote_agent(remote.metadata)
        local, far = [], []
        for entry, view in payloads:
            if len(view) == 0:
                continue
            address = _address(view)
            self._register(address, len(view))
            local.append((address, len(view), 0))
            far.append((*remote.addresses[entry.index], 0))
        indices = tuple(entry.index for entry, _ in payloads)
        shard = payloads[0][0].shard
        if not local:
            links.send(sock, PushWritten(begin.version, begin.incarnation, begin.attempt, indices))
            return
        handle = _start(self._agent, "WRITE", local, far, remote.agent)
        self._pending[shard] = (handle, sock, begin, indices)

    def _register(self, address: int, size: int) -> None:
        _register_region(self._agent, self._registered, address, size)

    def progress(self) -> list[int]:
        failed = []
        for shard, (handle, sock, begin, indices) in list(self._pending.items()):
            state = _state(self._agent, handle)
            if state == "DONE":
                del self._pending[shard]
                links.send(sock, PushWritten(begin.version, begin.incarnation, begin.attempt, indices))
            elif state == "ERR":
                del self._pending[shard]
                failed.append(shard)
        return failed

    @property
    def is_busy(self) -> bool:
        return bool(self._pending)

    def cancel(self, shard_key: int) -> None:
        self._pending.pop(shard_key, None)

    def close(self) -> None:
        for handle in self._registered.values():
            self._agent.deregister_memory(handle)
        self._registered.clear()


class NixlPullDataPlane(PullDataPlane):
    name: ClassVar[str] = "nixl"
    is_in_band: ClassVar[bool] = False

    def __init__(self) -> None:
        self._agent = _agent("psrl-puller")
        self._pending: dict[int, tuple[Any, list[tuple[int, memoryview]]]] = {}
        self._registered: dict[tuple[int, int], Any] = {}  # destinations are reused across pulls

    @property
    def needs_live_check(self) -> bool:
        return True

    def request(
        self,
        sock: zmq.Socket[bytes],
        request: ShardPullRequest,
        offer: bytes,
        entries: Sequence[ManifestEntry],
        destinations: Sequence[memoryview],
    ) -> None:
        remote = msgspec.msgpack.decode(offer, type=_NixlOffer)
        self._agent.add_remote_agent(remote.metadata)
        local, far = [], []
        for entry, view in zip(entries, destinations, strict=True):
            if not len(view):
                continue
            address = _address(view)
            if (address, len(view)) not in self._registered:
                self._registered[(address, len(view))] = self._agent.register_memory(
                    [(address, len(view), 0, "")], DRAM
                )
            local.append((address, len(view), 0))
            far.append((*remote.addresses[entry.index], 0))
        handle = _start(self._agent, "READ", local, far, remote.agent) if local else None
        self._pending[request.request_id] = (handle, [(e.index, d) for e, d in zip(entries, destinations, strict=True)])

    def poll_landed(self) -> list[Landed]:
        out: list[Landed] = []
        for request_id, (handle, targets) in list(self._pending.items()):
            state = "DONE" if handle is None else _state(self._agent, handle)
            if state == "ERR":
                del self._pending[request_id]
                raise TransportError(f"NIXL read of request {request_id} failed")
            if state == "DONE":
                del self._pending[request_id]
                out.extend(Landed(request_id, index, view) for index, view in targets)
        return out

    @property
    def is_busy(self) -> bool:
        return bool(self._pending)

    def finish(self, request_id: int) -> None:
        self._pending.pop(request_id, None)

    def close(self) -> None:
        for handle in self._registered.values():
            self._agent.deregister_memory(handle)
        self._registered.clear()
