"""The one interface every weight transport implements (one transport per file).

Control messages (begin, ack, commit, manifests, requests) always travel on the PS's ZeroMQ
links; a transport only moves entry bytes. It has three sides:

* ``ShardDataPlane``: allocates a shard's version buffers, receives pushed bytes into them and
  serves pulled bytes out of them.
* ``PushDataPlane``: the trainer side; sends a shard its entries once the shard is ready.
* ``PullDataPlane``: the rollout side; fetches entries of one shard into buffers it returns.

In-band transports (ZeroMQ frames) carry the bytes as payload frames on the links themselves;
out-of-band transports (NIXL, torch.distributed) move them on their own channel and report
entries as *landed* when they complete. Shard, pusher and puller never look at which one is used.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import zmq

from psrl.ps.manifest import ManifestEntry, shard_offsets
from psrl.ps.protocol import Message, ProtocolError, PullRequest, PushBegin


class TransportError(RuntimeError):
    """A transfer failed on the data plane (the push or pull it belongs to fails and is retried)."""


@dataclass
class EntryBuffers:
    """The bytes of one version on one shard (or of one pull on a puller), entry by entry.

    ``backing`` is a contiguous buffer when the transport needs registered memory; otherwise the
    views own their memory (received frames). ``handle`` is transport state (a registration).
    """

    views: dict[int, memoryview] = field(default_factory=dict)
    backing: np.ndarray | None = None
    offsets: dict[int, int] = field(default_factory=dict)  # byte offset of each entry in ``backing``
    handle: Any = None

    @classmethod
    def contiguous(cls, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        """One buffer laid out by aligned offsets (the shard layout)."""
        offsets, size = shard_offsets(e.num_bytes for e in entries)
        backing = np.empty(max(size, 1), dtype=np.uint8)
        whole = backing.data
        views = {e.index: whole[o : o + e.num_bytes] for e, o in zip(entries, offsets, strict=True)}
        return cls(views=views, backing=backing, offsets={e.index: o for e, o in zip(entries, offsets, strict=True)})

    def address(self, index: int) -> int:
        """Virtual address of an entry in the contiguous backing buffer."""
        if self.backing is None:
            raise TransportError("entry buffers without a contiguous backing have no address")
        return int(self.backing.ctypes.data) + self.offsets[index]

    def view(self, index: int) -> memoryview:
        return self.views[index]


# (message, payload) -> None; raises psrl.ps.links.LinkError when the requester is gone.
Replier = Callable[[Message, "memoryview | None"], None]


@dataclass(frozen=True)
class Landed:
    """An entry that finished arriving on an out-of-band transport."""

    key: int  # push attempt key (shard side) or request id (puller side)
    entry_index: int
    view: memoryview


class ShardDataPlane(ABC):
    name: ClassVar[str]
    is_in_band: ClassVar[bool]

    @abstractmethod
    def allocate(self, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        """Storage for an incoming push of these entries."""

    def adopt(self, buffers: EntryBuffers) -> None:  # noqa: B027 (optional hook)
        """Make contiguous buffers built by the shard (a cast copy) servable, e.g. register them."""

    def push_offer(self, buffers: EntryBuffers, begin: PushBegin, key: int) -> bytes:
        """What the pusher needs to write into ``buffers`` (descriptors, a rendezvous); b"" if nothing."""
        return b""

    def accept_payload(self, buffers: EntryBuffers, entry: ManifestEntry, frame: zmq.Frame) -> memoryview:
        """In-band transports: store a payload frame; returns the entry's bytes."""
        raise ProtocolError(f"{self.name} does not carry payload frames")

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
        self, reply: Replier, request: PullRequest, entries: Sequence[ManifestEntry], buffers: EntryBuffers
    ) -> None:
        """Send ``entries`` of a committed version to the requester."""

    def release(self, buffers: EntryBuffers) -> None:  # noqa: B027 (optional hook)
        """A version was retired or a push abandoned; its buffers are no longer served."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Free transport resources."""


class PushDataPlane(ABC):
    name: ClassVar[str]

    @abstractmethod
    def send(
        self,
        sock: zmq.Socket[bytes],
        begin: PushBegin,
        offer: bytes,
        payloads: Sequence[tuple[ManifestEntry, memoryview]],
    ) -> None:
        """Start sending one shard its entries (returns without waiting for the bytes to arrive)."""

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

    @abstractmethod
    def request(
        self, sock: zmq.Socket[bytes], request: PullRequest, offer: bytes, entries: Sequence[ManifestEntry]
    ) -> None:
        """Start fetching ``entries`` from one shard (replies arrive on ``sock`` or as landed entries)."""

    def accept_payload(self, entry: ManifestEntry, frame: zmq.Frame) -> memoryview:
        """In-band transports: the bytes of a received payload frame."""
        raise ProtocolError(f"{self.name} does not carry payload frames")

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

    def finish(self, request_id: int) -> None:  # noqa: B027 (optional hook)
        """The pull this request belongs to finished or failed: drop its state and buffers."""

    @property
    def peer(self) -> str:
        return ""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Free transport resources."""
