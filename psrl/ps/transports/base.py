"""The one interface every weight transport implements (one transport per file).

Control messages (begin, ack, commit, manifests, requests) always travel on the PS's ZeroMQ
links; a transport only moves entry bytes. It has three sides:

* ``ShardDataPlane``: allocates a shard's version buffers, receives pushed bytes into them and
  serves pulled bytes out of them.
* ``PushDataPlane``: the trainer side; sends a shard its entries once the shard is ready.
* ``PullDataPlane``: the rollout side; fetches entries of one shard into buffers it returns.

In-band transports (ZeroMQ frames) carry the bytes as payload frames on the links themselves,
received straight into the destination buffer; out-of-band transports (NIXL, torch.distributed)
move them on their own channel and report entries as *landed* when they complete. Shard, pusher
and puller never look at which one is used.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import zmq

from psrl.ps.manifest import ManifestEntry, shard_offsets
from psrl.ps.protocol import Message, PullError, PushBegin, ShardPullRequest


class TransportError(RuntimeError):
    """A transfer failed on the data plane (the push or pull it belongs to fails and is retried)."""


def heap_bytes(size: int) -> tuple[np.ndarray, Any]:
    """Plain process memory (the default backing of a shard's version buffer)."""
    return np.empty(size, dtype=np.uint8), None


# size -> (backing bytes, transport handle): where a shard's version buffers live.
Allocator = Callable[[int], "tuple[np.ndarray, Any]"]


@dataclass
class EntryBuffers:
    """The bytes of one version on one shard, entry by entry, in one contiguous buffer.

    ``handle`` is transport state (a registration); ``trackers`` tell when zero-copy sends of these
    bytes are finished, so the buffer can be reused for a later version.
    """

    views: dict[int, memoryview] = field(default_factory=dict)
    backing: np.ndarray | None = None
    offsets: dict[int, int] = field(default_factory=dict)  # byte offset of each entry in ``backing``
    handle: Any = None
    trackers: list[zmq.MessageTracker] = field(default_factory=list)
    num_readers: int = 0  # transfers reading these bytes outside ZeroMQ (helper threads)

    @classmethod
    def contiguous(
        cls,
        entries: Sequence[ManifestEntry],
        backing: np.ndarray | None = None,
        handle: Any = None,
        allocate: Allocator | None = None,
    ) -> EntryBuffers:
        """Entries laid out by aligned offsets (the shard layout), in ``backing`` or a new buffer."""
        offsets, size = shard_offsets(e.num_bytes for e in entries)
        if backing is None or backing.nbytes != max(size, 1):
            backing, handle = (allocate or heap_bytes)(max(size, 1))
        whole = backing.data
        views = {e.index: whole[o : o + e.num_bytes] for e, o in zip(entries, offsets, strict=True)}
        offset_of = {e.index: o for e, o in zip(entries, offsets, strict=True)}
        return cls(views=views, backing=backing, offsets=offset_of, handle=handle)

    def view(self, index: int) -> memoryview:
        return self.views[index]

    def address(self, index: int) -> int:
        """Virtual address of an entry in the contiguous backing buffer."""
        if self.backing is None:
            raise TransportError("entry buffers without a contiguous backing have no address")
        return int(self.backing.ctypes.data) + self.offsets[index]

    def track(self, tracker: zmq.MessageTracker | None) -> None:
        if tracker is None:
            return
        if len(self.trackers) > 512:
            self.trackers = [t for t in self.trackers if not t.done]
        self.trackers.append(tracker)

    @property
    def is_idle(self) -> bool:
        """No send still reads these bytes."""
        return self.num_readers == 0 and all(t.done for t in self.trackers)


class BufferPool:
    """Keeps a few retired version buffers, so the next version is written into warm memory.

    Fresh memory costs a page fault per 4 KiB on first write, which halves receive throughput; a
    buffer is reused only once no zero-copy send still reads it (a slow reader keeps its buffer).
    """

    def __init__(self, max_spare: int = 2, allocate: Allocator | None = None) -> None:
        self.max_spare = max_spare
        self._allocate = allocate
        self._spare: list[EntryBuffers] = []
        self.num_reused = 0

    def take(self, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        _, size = shard_offsets(e.num_bytes for e in entries)
        for i, spare in enumerate(self._spare):
            if spare.backing is not None and spare.backing.nbytes == max(size, 1) and spare.is_idle:
                del self._spare[i]
                self.num_reused += 1
                return EntryBuffers.contiguous(entries, backing=spare.backing, handle=spare.handle)
        return EntryBuffers.contiguous(entries, allocate=self._allocate)

    def give(self, buffers: EntryBuffers) -> list[EntryBuffers]:
        """Keep ``buffers`` for reuse; returns the buffers evicted to make room (their owner frees them)."""
        if buffers.backing is None:
            return []
        self._spare.append(buffers)
        # Prefer keeping idle buffers; evict the oldest beyond the limit.
        self._spare.sort(key=lambda b: not b.is_idle)
        evicted = self._spare[self.max_spare :]
        del self._spare[self.max_spare :]
        return evicted


# entry -> the payload of its sparse delta (psrl.ps.delta), or None to send it whole.
SparseSource = Callable[[ManifestEntry], "memoryview | None"]
# (message, payload) -> tracker of the payload's send; raises psrl.ps.links.LinkError when the peer is gone.
Replier = Callable[[Message, "memoryview | None"], "zmq.MessageTracker | None"]


@dataclass(frozen=True)
class Landed:
    """An entry that finished arriving on an out-of-band transport."""

    key: int  # push attempt key (shard side) or request id (puller side)
    entry_index: int
    view: memoryview  # where the bytes are


class ShardDataPlane(ABC):
    name: ClassVar[str]
    is_in_band: ClassVar[bool]

    @abstractmethod
    def allocate(self, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        """Contiguous storage for these entries (an incoming push, or a cast copy of one)."""

    def push_offer(self, buffers: EntryBuffers, begin: PushBegin, key: int) -> bytes:
        """What the pusher needs to write into ``buffers`` (descriptors, a rendezvous); b"" if nothing."""
        return b""

    def poll_landed(self) -> list[Landed]:
        """Out-of-band transports: entries that arrived since the last call."""
        return []

    @property
    def is_busy(self) -> bool:
        """True while asynchronous transfers are in flight (the shard then polls more often)."""
        return False

    def pull_offer(self, buffers: EntryBuffers) -> bytes:
        """What a puller needs to read ``buffers`` directly; b"" if the shard sends them."""
        return b""

    @abstractmethod
    def serve(
        self,
        reply: Replier,
        request: ShardPullRequest,
        entries: Sequence[ManifestEntry],
        buffers: EntryBuffers,
        sparse: SparseSource | None = None,
    ) -> None:
        """Send ``entries`` of a committed version to the requester.

        ``sparse(entry)`` gives a sparse delta from the requester's base version when one is smaller
        than the entry; transports that cannot carry it send every entry whole.
        """

    def release(self, buffers: EntryBuffers) -> None:  # noqa: B027 (optional hook)
        """A version was retired or a push abandoned; its buffers are no longer served."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Free transport resources."""


class DirectAccessShardPlane(ShardDataPlane):
    """A shard plane whose peers write and read its buffers themselves (NIXL, shared memory): one
    offer, built by ``_offer``, serves both directions, and the shard never sends entries."""

    is_in_band: ClassVar[bool] = False

    @abstractmethod
    def _offer(self, buffers: EntryBuffers) -> bytes:
        """What a peer needs to reach ``buffers`` directly."""

    def push_offer(self, buffers: EntryBuffers, begin: PushBegin, key: int) -> bytes:
        return self._offer(buffers)

    def pull_offer(self, buffers: EntryBuffers) -> bytes:
        return self._offer(buffers)

    def serve(
        self,
        reply: Replier,
        request: ShardPullRequest,
        entries: Sequence[ManifestEntry],
        buffers: EntryBuffers,
        sparse: SparseSource | None = None,
    ) -> None:
        reply(PullError(request.request_id, request.version, f"{self.name} pulls read shard memory directly"), None)


class PushDataPlane(ABC):
    name: ClassVar[str]
    # Copies a trainer's device tensors straight into the shard's memory (``send_device``) and hashes
    # each entry there once it landed: such a push sends its checksums after the bytes
    # (``PushBegin.checksums_follow``), so no host staging buffer and no host copy are needed.
    copies_from_device: ClassVar[bool] = False

    @abstractmethod
    def send(
        self,
        sock: zmq.Socket[bytes],
        begin: PushBegin,
        offer: bytes,
        payloads: Sequence[tuple[ManifestEntry, memoryview]],
    ) -> None:
        """Start sending one shard its entries (returns without waiting for the bytes to arrive)."""

    def send_device(
        self, sock: zmq.Socket[bytes], begin: PushBegin, offer: bytes, entries: Sequence[ManifestEntry], weights: Any
    ) -> None:
        """Start copying ``weights`` (``psrl.ps.staging.DeviceWeights``) straight into the shard's memory,
        hashing each entry there when ``begin.checksums_follow`` (``take_checksums`` returns them)."""
        raise NotImplementedError(f"the {self.name} transport pushes from host memory only")

    def take_checksums(self) -> dict[int, int]:
        """Checksums of entries hashed in place since the last call (entry index -> checksum)."""
        return {}

    def progress(self) -> list[int]:
        """Drive asynchronous sends; returns the shards whose send failed (their attempt restarts)."""
        return []

    @property
    def is_busy(self) -> bool:
        return False

    def cancel(self, shard_key: int) -> None:  # noqa: B027 (optional hook)
        """Forget a shard's unfinished sends (it restarted; the push to it starts over)."""

    @property
    def peer(self) -> str:
        """This pusher's data-plane identity, sent in PushBegin."""
        return ""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Free transport resources."""


class PullDataPlane(ABC):
    name: ClassVar[str]
    is_in_band: ClassVar[bool]
    # Landed views are the shard's own memory, mapped (not the destinations): the puller reads them
    # in place, copying only what it must keep (its mirror).
    lands_in_place: ClassVar[bool] = False

    @abstractmethod
    def request(
        self,
        sock: zmq.Socket[bytes],
        request: ShardPullRequest,
        offer: bytes,
        entries: Sequence[ManifestEntry],
        destinations: Sequence[memoryview],
    ) -> None:
        """Start fetching ``entries`` of one shard into ``destinations`` (the puller's memory).

        In-band transports only send the request: payloads arrive on ``sock`` and the puller receives
        them into the destinations. Out-of-band ones write the destinations and report landed entries.
        """

    def poll_landed(self) -> list[Landed]:
        """Out-of-band transports: entries that arrived since the last call."""
        return []

    @property
    def is_busy(self) -> bool:
        return False

    @property
    def needs_live_check(self) -> bool:
        """True when the shard cannot see the read (one-sided reads): the puller confirms the version after."""
        return False

    @property
    def reads_verified_memory(self) -> bool:
        """True when landed views are the shard's own pages, which it verified before committing and never
        writes while the version is live, seen through a mapping no one can write (the live check after
        the pull confirms the version stayed live): hashing them again would prove nothing new."""
        return False

    def finish(self, request_id: int) -> None:  # noqa: B027 (optional hook)
        """The pull this request belongs to finished or failed: drop its state and buffers."""

    @property
    def peer(self) -> str:
        return ""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Free transport resources."""
