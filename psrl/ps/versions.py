"""The version state of one shard: pure decisions, no sockets and no bytes.

A shard holds at most three versions: the one being pushed (``incoming``), the newest committed
one (``latest``) and the one before it (``previous``), which stays readable so that pulls started
before a commit finish. Committing ``v`` promotes ``incoming`` and retires the version before
``previous``; pulls of a retired version fail and are retried on a newer one. No lock is shared
between pushes and pulls: a push only ever writes ``incoming``, a pull only reads committed versions.

Rules (each refusal carries a reason for the pusher):

* A push from a trainer incarnation lower than the highest one seen is refused, and so are its
  chunks and commits.
* Version numbers are immutable once committed: a push of ``v <= latest`` is refused.
* A new ``PushBegin`` of the same version and incarnation (a retry, ``attempt`` + 1) restarts
  the incoming push; chunks of earlier attempts are dropped.
* Commit succeeds only for the incoming push of the same version and incarnation once every one of
  its entries has landed and been verified; committing the latest version again is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import msgspec

from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import PushBegin

BuffersT = TypeVar("BuffersT")
NONE = -1  # version number reported when a slot is empty


class VersionHeader(Protocol):
    """What identifies a version's layout: an incoming push, or a snapshot's header."""

    @property
    def version(self) -> int: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def digest(self) -> bytes: ...
    @property
    def num_shards(self) -> int: ...
    @property
    def num_entries(self) -> int: ...
    @property
    def algorithm(self) -> str: ...


@dataclass
class IncomingPush(Generic[BuffersT]):
    version: int
    incarnation: int
    attempt: int
    digest: bytes
    num_shards: int
    num_entries: int
    algorithm: str
    entries: dict[int, ManifestEntry]
    buffers: BuffersT
    landed: set[int] = field(default_factory=set)
    served_entries: tuple[ManifestEntry, ...] | None = None
    served_buffers: BuffersT | None = None
    checksums_follow: bool = False  # entries' checksums come with PushWritten, the digest with PushSealed
    source_checked: bool = False  # the pusher checked the landed bytes against their source: no re-hash

    @property
    def is_landed(self) -> bool:
        """Every entry verified and, when its checksums followed the bytes, the digest received."""
        return len(self.landed) == len(self.entries) and bool(self.digest or not self.checksums_follow)

    @property
    def is_complete(self) -> bool:
        return self.served_entries is not None


@dataclass(frozen=True)
class HeldVersion(Generic[BuffersT]):
    version: int
    incarnation: int
    digest: bytes
    num_shards: int
    num_entries: int
    algorithm: str
    entries: tuple[ManifestEntry, ...]
    buffers: BuffersT
    by_index: dict[int, ManifestEntry]
    # Sparse deltas from an older version, computed on first request: (base version, entry) -> payload.
    sparse_cache: dict[tuple[int, int], memoryview | None] = field(default_factory=dict)

    @classmethod
    def of(cls, header: VersionHeader, entries: tuple[ManifestEntry, ...], buffers: BuffersT) -> HeldVersion[BuffersT]:
        return cls(
            version=header.version,
            incarnation=header.incarnation,
            digest=header.digest,
            num_shards=header.num_shards,
            num_entries=header.num_entries,
            algorithm=header.algorithm,
            entries=entries,
            buffers=buffers,
            by_index={e.index: e for e in entries},
        )


@dataclass(frozen=True)
class CommitOutcome(Generic[BuffersT]):
    is_ok: bool
    reason: str = ""
    retired: HeldVersion[BuffersT] | None = None
    is_new: bool = False


class ShardVersions(Generic[BuffersT]):
    def __init__(self, shard: int, num_shards: int) -> None:
        self.shard = shard
        self.num_shards = num_shards
        self.max_incarnation = -1
        self.incoming: IncomingPush[BuffersT] | None = None
        self.latest: HeldVersion[BuffersT] | None = None
        self.previous: HeldVersion[BuffersT] | None = None

    # push ---------------------------------------------------------------------------------------

    def check_begin(self, begin: PushBegin) -> str | None:
        """Why this push must be refused, or None when it may start."""
        if begin.incarnation < self.max_incarnation:
            return f"stale trainer incarnation {begin.incarnation} < {self.max_incarnation}"
        if self.latest is not None and begin.version <= self.latest.version:
            return f"version {begin.version} is not newer than committed version {self.latest.version}"
        incoming = self.incoming
        if incoming is not None and incoming.incarnation == begin.incarnation:
            if begin.version < incoming.version:
                return f"version {begin.version} superseded by incoming version {incoming.version}"
            if begin.version == incoming.version and begin.attempt < incoming.attempt:
                return f"attempt {begin.attempt} superseded by attempt {incoming.attempt}"
        if begin.num_shards != self.num_shards:
            return f"push is planned for {begin.num_shards} shards, this PS has {self.num_shards}"
        if any(e.shard != self.shard for e in begin.entries):
            return f"push sends entries of other shards to shard {self.shard}"
        return None

    def begin(self, begin: PushBegin, buffers: BuffersT) -> IncomingPush[BuffersT] | None:
        """Start ``begin`` (already checked); returns the push it replaces, whose buffers are released."""
        replaced = self.incoming
        self.max_incarnation = max(self.max_incarnation, begin.incarnation)
        self.incoming = IncomingPush(
            version=begin.version,
            incarnation=begin.incarnation,
            attempt=begin.attempt,
            digest=begin.digest,
            num_shards=begin.num_shards,
            num_entries=begin.num_entries,
            algorithm=begin.algorithm,
            entries={e.index: e for e in begin.entries},
            buffers=buffers,
            checksums_follow=begin.checksums_follow,
            source_checked=begin.checksums_follow and begin.source_checked,
        )
        return replaced

    def take_checksum(self, entry: ManifestEntry, checksums: tuple[int, ...], position: int) -> ManifestEntry | str:
        """The entry as verified: with the checksum its ``PushWritten`` brought when the push's checksums
        follow the bytes (``checksums[position]``); the reason to refuse the message otherwise."""
        incoming = self.incoming
        follow = incoming is not None and incoming.checksums_follow
        if not checksums:
            return f"entry {entry.index} was written without its checksum" if follow else entry
        if not follow or incoming is None:
            return "checksums sent for a push whose begin carried them"
        if len(checksums) <= position:
            return f"{len(checksums)} checksums for more entries"
        entry = msgspec.structs.replace(entry, checksum=checksums[position])
        incoming.entries[entry.index] = entry
        return entry

    def seal(self, version: int, incarnation: int, attempt: int, digest: bytes) -> str | None:
        """Record the digest of a push whose checksums followed its bytes; the reason to refuse, or None."""
        incoming = self.incoming
        if incoming is None or (version, incarnation, attempt) != (
            incoming.version,
            incoming.incarnation,
            incoming.attempt,
        ):
            return f"seal of push {version}/{incarnation}/{attempt} does not match the incoming push"
        if not incoming.checksums_follow or not digest:
            return f"push {version}/{incarnation}/{attempt} is not sealed by a digest"
        incoming.digest = digest
        return None

    def match_chunk(self, version: int, incarnation: int, attempt: int, entry_index: int) -> ManifestEntry | str:
        """The entry a chunk fills, or the reason it is dropped."""
        incoming = self.incoming
        if incoming is None:
            return f"no push in progress (chunk of version {version})"
        if (version, incarnation, attempt) != (incoming.version, incoming.incarnation, incoming.attempt):
            return f"chunk of push {version}/{incarnation}/{attempt} does not match the incoming push"
        entry = incoming.entries.get(entry_index)
        if entry is None:
            return f"entry {entry_index} is not on shard {self.shard}"
        if entry_index in incoming.landed:
            return f"entry {entry_index} already landed"
        return entry

    def mark_landed(self, entry_index: int) -> bool:
        """Record a verified entry; True when the incoming push is now fully landed."""
        if self.incoming is None:
            return False
        self.incoming.landed.add(entry_index)
        return self.incoming.is_landed

    def finalize(self, served_entries: tuple[ManifestEntry, ...], served_buffers: BuffersT) -> None:
        """The landed push, as it will be served (cast to the serving dtype when that differs)."""
        if self.incoming is None or not self.incoming.is_landed:
            raise RuntimeError("finalize needs a fully landed incoming push")
        self.incoming.served_entries = served_entries
        self.incoming.served_buffers = served_buffers

    def abort(self, version: int, incarnation: int) -> IncomingPush[BuffersT] | None:
        incoming = self.incoming
        if incoming is None or (incoming.version, incoming.incarnation) != (version, incarnation):
            return None
        self.incoming = None
        return incoming

    def commit(self, version: int, incarnation: int) -> CommitOutcome[BuffersT]:
        latest = self.latest
        if latest is not None and latest.version == version and latest.incarnation == incarnation:
            return CommitOutcome(is_ok=True)
        if incarnation < self.max_incarnation:
            return CommitOutcome(is_ok=False, reason=f"stale trainer incarnation {incarnation}")
        incoming = self.incoming
        if incoming is None or (incoming.version, incoming.incarnation) != (version, incarnation):
            return CommitOutcome(is_ok=False, reason=f"version {version} is not prepared on shard {self.shard}")
        if not incoming.is_complete or incoming.served_entries is None or incoming.served_buffers is None:
            return CommitOutcome(is_ok=False, reason=f"version {version} is incomplete on shard {self.shard}")
        held = HeldVersion.of(incoming, incoming.served_entries, incoming.served_buffers)
        retired = self.previous
        self.previous, self.latest, self.incoming = self.latest, held, None
        return CommitOutcome(is_ok=True, retired=retired, is_new=True)

    def restore(self, held: HeldVersion[BuffersT]) -> None:
        """Serve ``held``, read back from a snapshot by a restarted shard that holds nothing yet."""
        if self.latest is not None or self.incoming is not None:
            raise RuntimeError("only an empty shard restores a snapshot")
        self.latest = held
        self.max_incarnation = max(self.max_incarnation, held.incarnation)

    # pull ---------------------------------------------------------------------------------------

    def lookup(self, version: int) -> HeldVersion[BuffersT] | None:
        """A committed version this shard still serves (``version < 0`` means the latest)."""
        if version < 0:
            return self.latest
        for held in (self.latest, self.previous):
            if held is not None and held.version == version:
                return held
        return None

    @property
    def latest_version(self) -> int:
        return self.latest.version if self.latest is not None else NONE

    @property
    def previous_version(self) -> int:
        return self.previous.version if self.previous is not None else NONE

    @property
    def incoming_version(self) -> int:
        return self.incoming.version if self.incoming is not None else NONE
