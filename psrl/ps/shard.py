"""One parameter-server shard as a server object: its sockets, its versions and a run loop.

An actor (or a test, or a benchmark) hosts it: ``run(stop_event)`` in its own thread or process,
or ``poll_once()`` from an existing loop. The shard binds two ROUTER sockets, one for the pusher
and one for pullers, so a large pull never queues in front of a push's control messages.

Publication: a version becomes readable on a shard when the pusher commits it there, which it does
only after every shard acknowledged holding the version completely. Shard 0 is committed last, so
its commit hook (``on_commit``, with ``VersionEvent.is_announcer``) is the single point where the
hosting actor announces ``WeightsPublished(version)``: at that moment every shard serves the version.
"""

from __future__ import annotations

import functools
import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from bus.drops import is_sparse_log_point
from bus.security import CurveKeys, start_authenticator
from psrl.log import get_logger
from psrl.ps import links
from psrl.ps.delta import encode_sparse
from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import (
    PROTOCOL_VERSION,
    Commit,
    CommitRefused,
    Committed,
    LiveCheck,
    LiveReply,
    ManifestReply,
    ManifestRequest,
    Message,
    ProtocolError,
    PullError,
    PushAbort,
    PushAck,
    PushBegin,
    PushChunk,
    PushReady,
    PushRefused,
    PushSealed,
    PushWritten,
    ShardPullRequest,
    ShardStatus,
    StatusRequest,
    Unavailable,
)
from psrl.ps.serving import land_entry, needs_cast, served_layout
from psrl.ps.snapshot import DataFile, ShardSnapshots
from psrl.ps.transports import ShardDataPlane, shard_plane
from psrl.ps.transports.base import EntryBuffers, Landed, SparseSource
from psrl.ps.verify import Verifier
from psrl.ps.versions import NONE, HeldVersion, IncomingPush, ShardVersions

IDLE_POLL_MS = 100
BUSY_POLL_MS = 2


@dataclass(frozen=True)
class VersionEvent:
    """What a hosting actor needs to announce a shard's progress on the bus.

    ``on_stored``: this shard holds its part of ``version`` completely (``ShardStored``).
    ``on_commit``: this shard serves ``version``; when ``is_announcer`` (shard 0, committed last),
    every shard does, which is ``WeightsPublished(version, digest.hex(), num_shards)``.
    """

    shard: int
    num_shards: int
    version: int
    digest: bytes
    num_entries: int
    num_bytes: int

    @property
    def is_announcer(self) -> bool:
        return self.shard == 0


VersionHook = Callable[[VersionEvent], None]


@dataclass(frozen=True)
class ShardOptions:
    shard: int
    num_shards: int
    push_endpoint: str
    pull_endpoint: str
    transport: str = "zmq"
    serve_dtype: str | None = None  # None: serve the training dtype as pushed
    host: str = "127.0.0.1"  # address out-of-band transports listen on
    curve: CurveKeys | None = None  # the run's CURVE keys: only authorized clients may push or pull
    snapshot_dir: str | None = None  # keep the committed version in files here (psrl.ps.snapshot)
    max_frame_bytes: int = -1  # the largest frame a client may send (a payload: one block); -1: any


class ShardServer:
    def __init__(
        self,
        options: ShardOptions,
        on_commit: VersionHook | None = None,
        on_stored: VersionHook | None = None,
        ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
        on_failed: Callable[[Exception], None] | None = None,
    ) -> None:
        self.options = options
        self.failure: Exception | None = None  # what ended the serving thread (``run``), if anything did
        self._on_failed = on_failed
        self.boot_id = uuid.uuid4().hex[:12]
        self.counters: Counter[str] = Counter()
        self.versions: ShardVersions[EntryBuffers] = ShardVersions(options.shard, options.num_shards)
        self._on_commit = on_commit
        self._on_stored = on_stored
        self._log = get_logger("psrl.ps.shard", shard=options.shard, boot=self.boot_id)
        self._plane: ShardDataPlane = shard_plane(options.transport, host=options.host)
        # Two helpers: checks and casts of consecutive entries overlap (results stay in order).
        self._verifier: Verifier[ManifestEntry | None] = Verifier(num_threads=2)
        self._cast: tuple[dict[int, ManifestEntry], EntryBuffers] | None = None
        self._served: dict[int, ManifestEntry] = {}
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        # A hosting actor's context has the authenticator already; a context of our own needs its own.
        curve = options.curve if self._own_ctx else None
        self._authenticator = start_authenticator(self._ctx, curve) if curve is not None else None
        limit = options.max_frame_bytes
        self._push_sock = links.make_router(self._ctx, options.push_endpoint, options.curve, limit)
        self._pull_sock = links.make_router(self._ctx, options.pull_endpoint, options.curve, limit)
        self._poller = zmq.Poller()
        self._poller.register(self._push_sock, zmq.POLLIN)
        self._poller.register(self._pull_sock, zmq.POLLIN)
        self._push_keys = itertools.count(1)
        self._incoming_key = 0
        self._incoming_ident = b""
        self._nacked: set[tuple[int, int, int]] = set()
        self._push_handlers: dict[type[Any], Callable[[bytes, Any], None]] = {
            PushBegin: self._on_begin,
            PushChunk: self._on_chunk,
            PushWritten: self._on_written,
            PushSealed: self._on_sealed,
            Commit: self._on_commit_msg,
            PushAbort: self._on_abort,
            StatusRequest: lambda ident, msg: self._reply_status(self._push_sock, ident, msg),
        }
        self._pull_handlers: dict[type[Any], Callable[[bytes, Any], None]] = {
            ManifestRequest: self._on_manifest,
            ShardPullRequest: self._on_pull,
            LiveCheck: self._on_live_check,
            StatusRequest: lambda ident, msg: self._reply_status(self._pull_sock, ident, msg),
        }
        self._snapshots: ShardSnapshots | None = None
        self._snapshot_file: DataFile | None = None
        if options.snapshot_dir is not None:
            self._snapshots = ShardSnapshots(Path(options.snapshot_dir), options.shard, options.num_shards)
            self._restore(self._snapshots)
        self._closed = False

    def _restore(self, snapshots: ShardSnapshots) -> None:
        restored = snapshots.load(self._plane.allocate, self._plane.release)
        if restored is None:
            return
        header = restored.header
        held = HeldVersion.of(header, header.entries, restored.buffers)
        self.versions.restore(held)
        self.counters["versions_restored"] += 1
        self._log.info("ps.shard.restored", version=held.version, entries=len(held.entries))

    # loop ---------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set, then close the sockets. An unexpected error ends the serving: it is
        kept in ``failure`` and handed to ``on_failed``, so that the host stops too rather than live on
        with a shard that answers no one (and a trainer whose push waits on it)."""
        try:
            while not stop.is_set():
                self.poll_once()
        except Exception as exc:
            self.failure = exc
            self._log.error("ps.shard.failed", error=f"{type(exc).__name__}: {exc}")
            if self._on_failed is not None:
                self._on_failed(exc)
        finally:
            self.close()

    def poll_once(self, timeout_ms: int | None = None) -> None:
        """Wait for traffic (at most ``timeout_ms``) and handle everything that is ready."""
        if timeout_ms is None:
            timeout_ms = BUSY_POLL_MS if self._plane.is_busy or self._verifier.num_pending else IDLE_POLL_MS
        ready = dict(self._poller.poll(timeout_ms))
        if self._push_sock in ready:
            self._drain(self._push_sock, self._push_handlers)
        if self._pull_sock in ready:
            self._drain(self._pull_sock, self._pull_handlers)
        for landed in self._plane.poll_landed():
            self._on_landed(landed)
        for key, entry, served in self._verifier.completed():
            self._on_verified(key, entry, served)

    def start_thread(self) -> tuple[threading.Thread, threading.Event]:
        stop = threading.Event()
        thread = threading.Thread(target=self.run, args=(stop,), name=f"ps-shard-{self.options.shard}", daemon=True)
        thread.start()
        return thread, stop

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._verifier.close()
        self._plane.close()
        self._push_sock.close(linger=0)
        self._pull_sock.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._own_ctx:
            self._ctx.term()

    def _drain(self, sock: zmq.Socket[bytes], handlers: dict[type[Any], Any]) -> None:
        # Bounded, so a flood on one socket cannot starve the other.
        for _ in range(256):
            try:
                received = links.recv_message(sock, has_ident=True)
            except ProtocolError as exc:
                self._drop("malformed", str(exc))
                continue
            if received is None:
                return
            ident, message = received
            handler = handlers.get(type(message))
            try:
                if handler is None:
                    self._drop("unexpected", type(message).__name__)
                else:
                    handler(ident, message)
            except links.LinkError as exc:
                self._drop("unroutable", str(exc))
            finally:
                links.discard_rest(sock)  # a payload the handler did not take

    def _drop(self, what: str, detail: str) -> None:
        key = f"dropped_{what}"
        self.counters[key] += 1
        if is_sparse_log_point(self.counters[key]):  # a flood of bad frames must not flood the log
            self._log.warning("ps.shard.dropped", what=what, count=self.counters[key], detail=detail[:200])

    def _push_reply(self, ident: bytes, message: Message) -> None:
        links.reply(self._push_sock, ident, message)

    # push ---------------------------------------------------------------------------------------

    def _on_begin(self, ident: bytes, begin: PushBegin) -> None:
        incoming = self.versions.incoming
        if incoming is not None and _same_attempt(incoming, begin) and not incoming.landed:
            # A begin sent again while this shard was slow to answer (allocating a large part): the
            # pusher writes out-of-band into the buffers it was first offered, so keep them.
            offer = self._plane.push_offer(incoming.buffers, begin, self._incoming_key)
            self._push_reply(ident, PushReady(begin.version, begin.attempt, self.boot_id, offer))
            return
        reason = self.versions.check_begin(begin)
        if reason is not None:
            self.counters["pushes_refused"] += 1
            refusal = PushRefused(
                begin.version, begin.attempt, reason, self.versions.latest_version, self.versions.max_incarnation
            )
            self._push_reply(ident, refusal)
            return
        buffers = self._plane.allocate(begin.entries)
        replaced = self.versions.begin(begin, buffers)
        if replaced is not None:
            self._plane.release(replaced.buffers)
        self._drop_cast()
        self._cast = self._prepare_cast(begin.entries)
        self._served = {}
        if self._snapshots is not None:
            self._snapshot_file = self._snapshots.begin(begin.version, begin.incarnation, begin.attempt)
        self._incoming_key = next(self._push_keys)
        self._incoming_ident = ident
        offer = self._plane.push_offer(buffers, begin, self._incoming_key)
        self._push_reply(ident, PushReady(begin.version, begin.attempt, self.boot_id, offer))
        if not begin.entries and not begin.checksums_follow:
            self._finish_landing()

    def _on_chunk(self, ident: bytes, chunk: PushChunk) -> None:
        match = self.versions.match_chunk(chunk.version, chunk.incarnation, chunk.attempt, chunk.entry_index)
        incoming = self.versions.incoming
        if isinstance(match, str) or incoming is None:
            self._nack(ident, (chunk.version, chunk.incarnation, chunk.attempt), str(match))
            return
        if not self._plane.is_in_band:
            self._fail_incoming(f"{self._plane.name} pushes carry no payload frames")
            return
        view = incoming.buffers.view(match.index)
        try:
            links.recv_payload_into(self._push_sock, view)
        except ProtocolError as exc:
            self._fail_incoming(str(exc))
            return
        self._land(match, view)

    def _on_written(self, ident: bytes, written: PushWritten) -> None:
        key = (written.version, written.incarnation, written.attempt)
        for position, index in enumerate(written.entry_indices):
            match = self.versions.match_chunk(*key, index)
            if not isinstance(match, str):
                match = self.versions.take_checksum(match, written.checksums, position)
            if isinstance(match, str):
                self._nack(ident, key, match)
                return
            incoming = self.versions.incoming
            if incoming is not None:
                self._land(match, incoming.buffers.view(index))

    def _on_sealed(self, ident: bytes, sealed: PushSealed) -> None:
        key = (sealed.version, sealed.incarnation, sealed.attempt)
        reason = self.versions.seal(*key, sealed.digest)
        if reason is not None:
            self._nack(ident, key, reason)
            return
        incoming = self.versions.incoming
        if incoming is not None and incoming.is_landed and not incoming.is_complete:
            self._finish_landing()

    def _on_landed(self, landed: Landed) -> None:
        incoming = self.versions.incoming
        if incoming is None or landed.key != self._incoming_key:
            self.counters["dropped_stale_landing"] += 1
            return
        entry = incoming.entries.get(landed.entry_index)
        if entry is None or landed.entry_index in incoming.landed:
            self.counters["dropped_stale_landing"] += 1
            return
        self._land(entry, landed.view)

    def _prepare_cast(self, entries: tuple[ManifestEntry, ...]) -> tuple[dict[int, ManifestEntry], EntryBuffers] | None:
        """Served layout and buffer when this shard serves another dtype (entries are cast as they land)."""
        serve_dtype = self.options.serve_dtype
        if serve_dtype is None or not needs_cast(entries, serve_dtype):
            return None
        ordered = sorted(entries, key=lambda e: e.index)
        draft = served_layout(ordered, serve_dtype)
        return {e.index: e for e in draft}, self._plane.allocate(draft)

    def _drop_cast(self) -> None:
        if self._cast is not None:
            self._plane.release(self._cast[1])
            self._cast = None

    def _land(self, entry: ManifestEntry, view: memoryview) -> None:
        incoming = self.versions.incoming
        if incoming is None:
            return
        cast_to = None
        served_buffers = incoming.buffers
        if self._cast is not None:
            drafts, served_buffers = self._cast
            cast_to = (drafts[entry.index], served_buffers.view(entry.index))
        # bytes the pusher checked against their source were hashed there: no second read of them
        verify = not incoming.source_checked
        job: Callable[[], ManifestEntry | None] = functools.partial(
            land_entry, entry, view, incoming.algorithm, cast_to, verify
        )
        if self._snapshot_file is not None:
            served_view = served_buffers.view(entry.index)
            offset = served_buffers.offsets[entry.index]
            job = functools.partial(_land_and_keep, job, self._snapshot_file, entry.index, served_view, offset)
        self._verifier.submit(self._incoming_key, entry, job)

    def _on_verified(self, key: int, entry: ManifestEntry, served: ManifestEntry | None) -> None:
        incoming = self.versions.incoming
        if incoming is None or key != self._incoming_key:
            return  # a verdict on a push that was restarted or replaced meanwhile
        if served is None:
            self.counters["checksum_failures"] += 1
            self._fail_incoming(f"entry {entry.index} ({entry.name}) failed its checksum")
            return
        self._served[entry.index] = served
        self.counters["bytes_received"] += entry.num_bytes
        if self.versions.mark_landed(entry.index):
            self._finish_landing()

    def _finish_landing(self) -> None:
        incoming = self.versions.incoming
        if incoming is None:
            return
        served = tuple(self._served[i] for i in sorted(incoming.entries))
        if self._cast is not None:
            buffers = self._cast[1]
            self._cast = None
            self._plane.release(incoming.buffers)
        else:
            buffers = incoming.buffers
        self.versions.finalize(served, buffers)
        if self._on_stored is not None:  # before the ack, so it precedes every commit of this version
            self._on_stored(self._event(incoming.version, incoming.digest, served))
        self._push_reply(self._incoming_ident, PushAck(incoming.version, incoming.attempt, is_ok=True))

    def _event(self, version: int, digest: bytes, entries: tuple[ManifestEntry, ...]) -> VersionEvent:
        num_bytes = sum(e.num_bytes for e in entries)
        return VersionEvent(self.options.shard, self.options.num_shards, version, digest, len(entries), num_bytes)

    def _fail_incoming(self, reason: str) -> None:
        incoming = self.versions.incoming
        if incoming is None:
            return
        self._log.warning("ps.shard.push_failed", version=incoming.version, attempt=incoming.attempt, reason=reason)
        self.versions.abort(incoming.version, incoming.incarnation)
        self._plane.release(incoming.buffers)
        self._drop_cast()
        self._drop_snapshot_file()
        self._push_reply(self._incoming_ident, PushAck(incoming.version, incoming.attempt, is_ok=False, reason=reason))

    def _nack(self, ident: bytes, key: tuple[int, int, int], reason: str) -> None:
        self.counters["dropped_stale_chunks"] += 1
        if key in self._nacked:
            return
        if len(self._nacked) > 1024:
            self._nacked.clear()
        self._nacked.add(key)
        self._push_reply(ident, PushAck(key[0], key[2], is_ok=False, reason=reason))

    def _on_commit_msg(self, ident: bytes, commit: Commit) -> None:
        outcome = self.versions.commit(commit.version, commit.incarnation)
        if not outcome.is_ok:
            self._push_reply(ident, CommitRefused(commit.version, outcome.reason))
            return
        if outcome.retired is not None:
            self._plane.release(outcome.retired.buffers)
            self.counters["versions_retired"] += 1
        if outcome.is_new:
            self._keep_snapshot()
            self.counters["versions_committed"] += 1
            self._log.info("ps.shard.committed", version=commit.version)
            if self._on_commit is not None and self.versions.latest is not None:
                held = self.versions.latest
                self._on_commit(self._event(held.version, held.digest, held.entries))
        self._push_reply(ident, Committed(commit.version))

    def _on_abort(self, ident: bytes, abort: PushAbort) -> None:
        dropped = self.versions.abort(abort.version, abort.incarnation)
        if dropped is not None:
            self._plane.release(dropped.buffers)
            self._drop_cast()
            self._drop_snapshot_file()

    def _drop_snapshot_file(self) -> None:
        if self._snapshots is not None:
            self._snapshots.drop_incoming()
        self._snapshot_file = None

    def _keep_snapshot(self) -> None:
        """Before ``Committed`` goes out: a shard that acknowledged a commit can always restore it."""
        held = self.versions.latest
        if self._snapshots is None or held is None:
            return
        self._snapshot_file = None
        if self._snapshots.commit(held):
            self.counters["snapshots_kept"] += 1

    # pull ---------------------------------------------------------------------------------------

    def _unavailable(self, request_id: int, version: int) -> Unavailable:
        reason = "retired" if 0 <= version < self.versions.previous_version else "not committed"
        return Unavailable(request_id, version, self.versions.latest_version, self.versions.previous_version, reason)

    def _on_manifest(self, ident: bytes, request: ManifestRequest) -> None:
        if request.protocol != PROTOCOL_VERSION:
            self.counters["pulls_refused"] += 1
            reason = (
                f"refused: the puller speaks PS protocol {request.protocol}, this shard {PROTOCOL_VERSION} "
                "(run one psrl version on shards and rollout hosts)"
            )
            links.reply(self._pull_sock, ident, Unavailable(request.request_id, request.version, NONE, NONE, reason))
            return
        held = self.versions.lookup(request.version)
        if held is None:
            links.reply(self._pull_sock, ident, self._unavailable(request.request_id, request.version))
            return
        reply = ManifestReply(
            request.request_id,
            held.version,
            held.digest,
            held.num_shards,
            held.num_entries,
            held.algorithm,
            held.entries,
            self._plane.pull_offer(held.buffers),
            PROTOCOL_VERSION,
        )
        links.reply(self._pull_sock, ident, reply)

    def _on_pull(self, ident: bytes, request: ShardPullRequest) -> None:
        held = self.versions.lookup(request.version)
        if held is None:
            self.counters["pulls_refused"] += 1
            reason = f"version {request.version} is {self._unavailable(request.request_id, request.version).reason}"
            links.reply(self._pull_sock, ident, PullError(request.request_id, request.version, reason))
            return
        entries = _requested(held, request.entry_indices)
        if entries is None:
            links.reply(self._pull_sock, ident, PullError(request.request_id, request.version, "unknown entry indices"))
            return

        def reply(message: Message, payload: memoryview | None) -> zmq.MessageTracker | None:
            return links.reply(self._pull_sock, ident, message, payload)

        self._plane.serve(reply, request, entries, held.buffers, self._sparse_source(held, request))
        self.counters["pulls_served"] += 1
        self.counters["bytes_served"] += sum(e.num_bytes for e in entries)

    def _sparse_source(self, held: HeldVersion[EntryBuffers], request: ShardPullRequest) -> SparseSource | None:
        """Sparse deltas from the request's base version to ``held``, when the shard still holds the
        base, for the entries the puller holds exactly as in the base."""
        base = self.versions.lookup(request.base_version) if request.base_version >= 0 else None
        if base is None or base.version == held.version or not request.base_indices:
            return None
        at_base = frozenset(request.base_indices)

        def sparse(entry: ManifestEntry) -> memoryview | None:
            if entry.index not in at_base:
                return None
            key = (base.version, entry.index)
            if key not in held.sparse_cache:
                held.sparse_cache[key] = _encode_delta(base, held, entry)
                self.counters["sparse_entries_encoded"] += 1
            return held.sparse_cache[key]

        return sparse

    def _on_live_check(self, ident: bytes, check: LiveCheck) -> None:
        is_live = self.versions.lookup(check.version) is not None
        links.reply(self._pull_sock, ident, LiveReply(check.request_id, check.version, is_live))

    def status(self, request_id: int = 0) -> ShardStatus:
        incoming = self.versions.incoming
        counters = dict(self.counters)
        if incoming is not None:
            counters["incoming_attempt"] = incoming.attempt
            counters["incoming_landed"] = len(incoming.landed)
        return ShardStatus(
            request_id,
            self.options.shard,
            self.boot_id,
            self.versions.latest_version,
            self.versions.previous_version,
            incoming.version if incoming is not None else NONE,
            self.versions.max_incarnation,
            counters,
        )

    def _reply_status(self, sock: zmq.Socket[bytes], ident: bytes, request: StatusRequest) -> None:
        links.reply(sock, ident, self.status(request.request_id))


def _land_and_keep(
    land: Callable[[], ManifestEntry | None], data: DataFile, index: int, served: memoryview, offset: int
) -> ManifestEntry | None:
    """Verify (and cast) a landed entry, then copy its served bytes into the push's snapshot file."""
    result = land()
    if result is not None:
        data.write(index, offset, served)
    return result


def _encode_delta(
    base: HeldVersion[EntryBuffers], held: HeldVersion[EntryBuffers], entry: ManifestEntry
) -> memoryview | None:
    old = base.by_index.get(entry.index)
    if old is None or (old.name, old.elem_start, old.num_elems, old.dtype) != (
        entry.name,
        entry.elem_start,
        entry.num_elems,
        entry.dtype,
    ):
        return None
    return encode_sparse(base.buffers.view(entry.index), held.buffers.view(entry.index), entry.dtype)


def _requested(held: HeldVersion[EntryBuffers], indices: tuple[int, ...]) -> list[ManifestEntry] | None:
    entries = [held.by_index.get(i) for i in indices]
    if any(e is None for e in entries):
        return None
    return [e for e in entries if e is not None]


def _same_attempt(incoming: IncomingPush[EntryBuffers], begin: PushBegin) -> bool:
    return (incoming.version, incoming.incarnation, incoming.attempt, incoming.digest) == (
        begin.version,
        begin.incarnation,
        begin.attempt,
        begin.digest,
    )
