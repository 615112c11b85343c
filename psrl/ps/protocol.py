"""Wire messages between pusher, shards and pullers (msgpack via msgspec, tagged structs).

Every message is one frame; ``PushChunk`` and ``PullChunk`` are followed by one payload frame
holding the entry's bytes (sent and received without copies). The PS protocol runs on the shards'
own sockets, never on the event bus; only ``WeightsPublished`` (emitted by the hosting actor) goes
there.

Push (pusher DEALER -> shard ROUTER): PushBegin -> PushReady | PushRefused; PushChunk* or
PushWritten* [PushSealed] -> PushAck; Commit -> Committed | CommitRefused; PushAbort. A push whose
checksums follow the bytes (``PushBegin.checksums_follow``: shared memory, where the pusher hashes
each entry in the shard's own pages as it writes them) carries them in ``PushWritten`` and the
version's digest in ``PushSealed``, sent once every shard's entries are hashed. When the pusher also
checked every landed entry against a word sum taken on its source device (``source_checked``), the
shard adopts those checksums without reading the bytes again.
Pull (puller DEALER -> shard ROUTER): ManifestRequest -> ManifestReply | Unavailable;
ShardPullRequest -> PullChunk* | PullDone | PullError; LiveCheck -> LiveReply; StatusRequest -> ShardStatus.
"""

from __future__ import annotations

from typing import Union

import msgspec

from psrl.ps.manifest import ManifestEntry

# 2: sparse pull chunks in psrl.ps.delta's packed format (SPARSE=2, PullChunk.num_bytes) for the
# entries a puller names as held at its base version (ShardPullRequest.base_indices). A shard and a
# puller of different versions refuse each other at the manifest exchange.
PROTOCOL_VERSION = 2
LATEST = -1  # ManifestRequest.version meaning "the newest version this shard has committed"


class ProtocolError(ValueError):
    """A frame that does not decode to a known PS message."""


class _Msg(msgspec.Struct, array_like=True, frozen=True, tag_field="kind", gc=False):
    pass


class PushBegin(_Msg, frozen=True, tag="push_begin"):
    version: int
    incarnation: int
    attempt: int
    digest: bytes
    num_shards: int
    num_entries: int
    algorithm: str
    entries: tuple[ManifestEntry, ...]
    peer: str = ""  # the pusher's data-plane identity (out-of-band transports rendezvous with it)
    # entries' checksums (0 here) come with PushWritten and the digest (empty here) with PushSealed
    checksums_follow: bool = False
    # the pusher checked each entry's landed bytes against a word sum of its source (a device copy)
    source_checked: bool = False


class PushReady(_Msg, frozen=True, tag="push_ready"):
    version: int
    attempt: int
    boot_id: str
    offer: bytes = b""  # transport data the pusher needs to write (NIXL descriptors, group key)


class PushRefused(_Msg, frozen=True, tag="push_refused"):
    version: int
    attempt: int
    reason: str
    latest_version: int
    max_incarnation: int


class PushChunk(_Msg, frozen=True, tag="push_chunk"):
    version: int
    incarnation: int
    attempt: int
    entry_index: int


class PushWritten(_Msg, frozen=True, tag="push_written"):
    """Out-of-band transports: the pusher has finished writing these entries into the shard's buffer."""

    version: int
    incarnation: int
    attempt: int
    entry_indices: tuple[int, ...]
    checksums: tuple[int, ...] = ()  # one per entry when the push's checksums follow the bytes


class PushSealed(_Msg, frozen=True, tag="push_sealed"):
    """The digest of a push whose checksums followed its bytes: nothing more will be written."""

    version: int
    incarnation: int
    attempt: int
    digest: bytes


class PushAck(_Msg, frozen=True, tag="push_ack"):
    version: int
    attempt: int
    is_ok: bool
    reason: str = ""


class Commit(_Msg, frozen=True, tag="commit"):
    version: int
    incarnation: int


class Committed(_Msg, frozen=True, tag="committed"):
    version: int


class CommitRefused(_Msg, frozen=True, tag="commit_refused"):
    version: int
    reason: str


class PushAbort(_Msg, frozen=True, tag="abort"):
    version: int
    incarnation: int


class ManifestRequest(_Msg, frozen=True, tag="manifest_request"):
    request_id: int
    version: int
    protocol: int = 1  # the puller's PROTOCOL_VERSION (peers before version 2 did not send it)


class ManifestReply(_Msg, frozen=True, tag="manifest_reply"):
    request_id: int
    version: int
    digest: bytes
    num_shards: int
    num_entries: int
    algorithm: str
    entries: tuple[ManifestEntry, ...]  # this shard's entries, in the dtype it serves
    offer: bytes = b""  # transport data a puller needs to read (NIXL descriptors)
    protocol: int = 1  # the shard's PROTOCOL_VERSION (shards before version 2 did not send it)


class Unavailable(_Msg, frozen=True, tag="unavailable"):
    request_id: int
    version: int
    latest: int
    previous: int
    reason: str


class ShardPullRequest(_Msg, frozen=True, tag="pull_request"):
    request_id: int
    version: int
    entry_indices: tuple[int, ...]
    peer: str = ""  # the puller's data-plane identity (out-of-band transports)
    base_version: int = -1  # delta sync: the version the puller's mirror last held whole
    base_indices: tuple[int, ...] = ()  # entries it holds exactly as in base_version: these may come sparse


class PullChunk(_Msg, frozen=True, tag="pull_chunk"):
    request_id: int
    version: int
    entry_index: int
    encoding: int = 0  # psrl.ps.delta.DENSE (the entry's bytes) or SPARSE (changes from base_version)
    num_bytes: int = 0  # SPARSE: bytes of the payload frame


class PullDone(_Msg, frozen=True, tag="pull_done"):
    request_id: int
    version: int


class PullError(_Msg, frozen=True, tag="pull_error"):
    request_id: int
    version: int
    reason: str


class LiveCheck(_Msg, frozen=True, tag="live_check"):
    request_id: int
    version: int


class LiveReply(_Msg, frozen=True, tag="live_reply"):
    request_id: int
    version: int
    is_live: bool


class StatusRequest(_Msg, frozen=True, tag="status_request"):
    request_id: int


class ShardStatus(_Msg, frozen=True, tag="shard_status"):
    request_id: int
    shard: int
    boot_id: str
    latest: int
    previous: int
    incoming: int
    max_incarnation: int
    counters: dict[str, int]


Message = Union[  # noqa: UP007 (msgspec needs a typing.Union of the tagged structs)
    PushBegin,
    PushReady,
    PushRefused,
    PushChunk,
    PushWritten,
    PushSealed,
    PushAck,
    Commit,
    Committed,
    CommitRefused,
    PushAbort,
    ManifestRequest,
    ManifestReply,
    Unavailable,
    ShardPullRequest,
    PullChunk,
    PullDone,
    PullError,
    LiveCheck,
    LiveReply,
    StatusRequest,
    ShardStatus,
]

_ENCODER = msgspec.msgpack.Encoder()
_DECODER: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)

# Messages followed by exactly one payload frame.
WITH_PAYLOAD = (PushChunk, PullChunk)


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def decode(frame: bytes | memoryview) -> Message:
    try:
        return _DECODER.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed PS message: {exc}") from None
