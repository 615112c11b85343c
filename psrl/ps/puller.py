"""Rollout side: pull one committed version from every shard in parallel, straight into the engine.

A pull fetches the version's manifest from every shard (all must report the same digest), asks
each shard for its entries, verifies every entry against its checksum as it lands (except pinned
shared-memory pulls, which read the shard's verified pages read-only and confirm afterwards that the
version stayed live: ``PullDataPlane.reads_verified_memory``), and hands each
tensor to the engine as soon as it is complete: ``pull(version, load)`` calls ``load(name, tensor)``,
and ``stream(version)`` is the same as an iterator for ``engine.load_weights(iterator, version)``.
Entries are received straight into the puller's host buffers (the *mirror*, one tensor per name,
reused across pulls), so a tensor handed out is a view of that buffer: valid during the call only,
since the next pull overwrites it. The engine copies it into its weights, casting to its own dtype.

Every chunk carries its version and request id, so a pull never mixes versions: a chunk of another
version or request is dropped, and a shard that no longer serves the version fails the pull
(``PullFailedError``). After a failure the engine may hold some tensors of the failed version;
``sync()`` retries until one version loads completely.

Delta sync uses the mirror as the record of what was loaded and fetches only entries whose checksum
changed, as sparse deltas (``psrl.ps.delta``) for entries the mirror holds exactly as in its base
version; afterwards every entry of the mirror is re-hashed against the new manifest, so the
reconstruction is checked exactly.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import zmq

from bus.security import CurveKeys
from psrl.log import get_logger
from psrl.ps import links
from psrl.ps.checksum import checksum
from psrl.ps.delta import DENSE, SPARSE, DeltaError, apply_sparse
from psrl.ps.dtypes import tensor_from_buffer
from psrl.ps.errors import PullFailedError
from psrl.ps.manifest import NO_CHECKSUM, ManifestEntry
from psrl.ps.mirror import Mirror
from psrl.ps.protocol import LATEST, ManifestReply, ProtocolError, PullChunk, PullDone, PullError, ShardPullRequest
from psrl.ps.pull_stream import PullResult, PullStream
from psrl.ps.serving import is_intact
from psrl.ps.shard_links import ShardLinks, VersionPlan
from psrl.ps.transports import PullDataPlane, TransportError, pull_plane
from psrl.ps.verify import Verifier, host_threads
from psrl.ps.versions import NONE

LoadFn = Callable[[str, torch.Tensor], None]


class Puller:
    def __init__(
        self,
        pull_endpoints: Sequence[str],
        *,
        transport: str = "zmq",
        delta_sync: bool = False,
        verify: bool = True,
        load_dtype: torch.dtype | None = None,
        timeout_s: float = 30.0,
        host: str = "127.0.0.1",
        ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
        curve: CurveKeys | None = None,
        pin_memory: bool = False,
    ) -> None:
        self.num_shards = len(pull_endpoints)
        self.delta_sync = delta_sync
        self.verify = verify
        self.load_dtype = load_dtype
        self.timeout_s = timeout_s
        self.held_version = NONE
        self.mirror = Mirror(pin_memory=pin_memory and torch.cuda.is_available())
        # Mapped (shared-memory) pulls land every entry at once: checking them is the pull's main cost.
        self._verifier: Verifier[bool] = Verifier(num_threads=host_threads())
        self._log = get_logger("psrl.ps.puller")
        self._plane: PullDataPlane = pull_plane(transport, host=host, pin_memory=pin_memory)
        self._own_ctx = ctx is None
        self._closed = False
        # One I/O thread per shard link (up to 4), so shards' streams are copied in parallel.
        self._ctx = ctx or zmq.Context(io_threads=min(4, max(1, len(pull_endpoints))))
        self._links = ShardLinks(self._ctx, pull_endpoints, timeout_s, self._log, curve)
        # told of each failed attempt of ``sync`` (version, attempt, max_attempts, reason), from whichever
        # thread pulls: an actor passes it on while the pull still blocks its loop
        self.on_retry: Callable[[int, int, int, str], None] | None = None

    # public -------------------------------------------------------------------------------------

    def pull(self, version: int, load: LoadFn) -> PullResult:
        """Pull ``version`` (``LATEST`` = shard 0's newest) into ``load``; PullFailedError on failure."""
        stream = self.stream(version)
        iterator = iter(stream)
        try:
            for name, tensor in iterator:
                load(name, tensor)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
        return stream.result

    def stream(self, version: int) -> PullStream:
        """The same pull as an iterator of (name, tensor); ``.result`` once exhausted."""
        return PullStream(functools.partial(self._run, version))

    def sync(self, load: LoadFn, version: int = LATEST, max_attempts: int = 5) -> PullResult:
        """Pull until one version loads completely; a retired version moves on to the newest one."""
        target = version
        last_error: PullFailedError | None = None
        for attempt in range(1, max_attempts + 1):
            try:
                result = self.pull(target, load)
            except PullFailedError as exc:
                last_error = exc
                self._log.warning("ps.pull_retry", version=target, attempt=attempt, reason=exc.reason)
                if self.on_retry is not None:
                    self.on_retry(target, attempt, max_attempts, exc.reason)
                if exc.latest > target >= 0 or (target >= 0 and "retired" in exc.reason):
                    target = LATEST
                continue
            return result.with_attempts(attempt)
        if last_error is None:
            raise PullFailedError(version, "no attempt was made")
        raise last_error

    def latest_version(self) -> int:
        """The newest version shard 0 (the announcer) has committed, or -1."""
        reply = self._links.manifest_from(0, LATEST)
        return reply.version if isinstance(reply, ManifestReply) else reply.latest

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._verifier.close()
        self._plane.close()
        self._links.close()
        self.mirror.close()
        if self._own_ctx:
            self._ctx.term()

    # transfer -----------------------------------------------------------------------------------

    def _needed(self, plan: VersionPlan) -> list[ManifestEntry]:
        if not self.delta_sync or plan.algorithm == NO_CHECKSUM:
            return list(plan.entries)
        return self.mirror.changed(plan.entries)

    def _run(self, version: int, stream: PullStream) -> Iterator[tuple[str, torch.Tensor]]:
        started = time.perf_counter()
        plan = self._links.resolve(version)
        stream.manifest_s = time.perf_counter() - started
        needed = self._needed(plan)
        self.mirror.prepare([e for e in plan.entries if not self._is_zero_copy(e)])
        request_ids = self._request(plan, needed)
        counts = _Counts(needed)
        try:
            for name, tensor in self._tensors(plan, needed, request_ids, counts, stream):
                self.held_version = NONE  # the engine now holds part of another version
                try:
                    yield name, tensor
                except GeneratorExit:
                    self.mirror.mark_dirty(name)
                    raise
            if self._plane.needs_live_check:
                self._links.confirm_live(plan.version)
        finally:
            for request_id in request_ids.values():
                self._plane.finish(request_id)
        if self.delta_sync and plan.algorithm != NO_CHECKSUM:
            self.mirror.settle(plan.version, plan.entries)  # re-hashed whole by _flush_dirty
        self.held_version = plan.version
        stream.finish(plan.version, plan.digest, plan.entries, len(needed), counts.num_loaded)

    def _tensors(
        self,
        plan: VersionPlan,
        needed: Sequence[ManifestEntry],
        request_ids: dict[int, int],
        counts: _Counts,
        stream: PullStream,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self._receive_entries(plan, needed, request_ids, counts, stream)
        if self.delta_sync:
            yield from self._flush_dirty(plan, counts)

    def _request(self, plan: VersionPlan, needed: Sequence[ManifestEntry]) -> dict[int, int]:
        request_ids: dict[int, int] = {}
        for shard, sock in enumerate(self._links.socks):
            part = [e for e in needed if e.shard == shard]
            if not part:
                continue
            request_ids[shard] = self._links.next_request_id()
            base_version, base_indices = self._sparse_base(plan, part)
            indices = tuple(e.index for e in part)
            request = ShardPullRequest(
                request_ids[shard], plan.version, indices, self._plane.peer, base_version, base_indices
            )
            # In-band transports receive each payload where it belongs when it arrives.
            destinations = [] if self._plane.is_in_band else [self._destination(e) for e in part]
            self._plane.request(sock, request, plan.parts[shard].offer, part, destinations)
        return request_ids

    def _sparse_base(self, plan: VersionPlan, part: Sequence[ManifestEntry]) -> tuple[int, tuple[int, ...]]:
        """The base version and the entries of ``part`` that may come as sparse deltas from it.

        Only checksummed versions: a delta is trusted because the result is re-hashed.
        """
        if not self.delta_sync or plan.algorithm == NO_CHECKSUM or not self._plane.is_in_band:
            return NONE, ()
        base_version, indices = self.mirror.base_for(part)
        return (NONE, ()) if base_version == plan.version else (base_version, indices)

    def _destination(self, entry: ManifestEntry) -> memoryview:
        return memoryview(b"") if self._is_zero_copy(entry) else self.mirror.destination(entry)

    def _is_zero_copy(self, entry: ManifestEntry) -> bool:
        """Whole tensors of a full pull are handed out as views of the received frame (ZeroMQ) or of
        the shard's mapped memory (shared memory).

        Everything else lands in the mirror: blocks of split tensors (assembled in place), and every
        entry under delta sync (the mirror is its record of what the engine holds).
        """
        in_place = self._plane.is_in_band or self._plane.lands_in_place
        return in_place and not self.delta_sync and entry.is_whole_tensor

    def _receive_entries(
        self,
        plan: VersionPlan,
        needed: Sequence[ManifestEntry],
        request_ids: dict[int, int],
        counts: _Counts,
        stream: PullStream,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        pending = {e.index: e for e in needed}
        checks = self.verify and not self._plane.reads_verified_memory
        algorithm = plan.algorithm if checks else NO_CHECKSUM
        self._verifier.clear()
        frames: dict[int, memoryview] = {}  # zero-copy entries: the received frame, until it is loaded
        last_progress = time.monotonic()
        while pending or self._verifier.num_pending:
            for entry, num_transferred, frame, source in self._arrivals(plan, request_ids, pending) if pending else ():
                last_progress = time.monotonic()
                del pending[entry.index]
                if frame is not None:
                    frames[entry.index] = frame
                    view = frame
                else:  # untrusted until verified, when it is (or will be) written here
                    view = self.mirror.entry_view(entry) if source is None else self.mirror.destination(entry)
                check = functools.partial(is_intact, entry, view, algorithm)
                if source is not None:  # copied into the mirror on the verifier's threads, then checked there
                    check = functools.partial(_copy_then_check, view, source, check)
                self._verifier.submit(num_transferred, entry, check)
                yield from self._verified(plan, self._verifier.completed(), counts, stream, frames)
            wait_s = 0.0 if pending else 0.1
            yield from self._verified(plan, self._verifier.completed(wait_s), counts, stream, frames)
            if time.monotonic() - last_progress > self.timeout_s:
                raise PullFailedError(plan.version, f"stalled; {len(pending)} entries missing", plan.version)

    def _verified(
        self,
        plan: VersionPlan,
        verdicts: list[tuple[int, ManifestEntry, bool]],
        counts: _Counts,
        stream: PullStream,
        frames: dict[int, memoryview],
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for num_transferred, entry, is_ok in verdicts:
            frame = frames.pop(entry.index, None)
            if not is_ok:
                self.mirror.forget(entry)
                raise PullFailedError(plan.version, f"entry {entry.index} ({entry.name}) failed its checksum")
            stream.num_bytes += num_transferred
            if frame is not None:
                counts.num_loaded += 1
                yield entry.name, self._cast(tensor_from_buffer(frame, entry.dtype, entry.shape))
                continue
            self.mirror.landed(entry)
            if counts.land(entry):
                yield entry.name, self._cast(self.mirror.take(entry.name))

    def _arrivals(
        self, plan: VersionPlan, request_ids: dict[int, int], pending: dict[int, ManifestEntry]
    ) -> Iterator[tuple[ManifestEntry, int, memoryview | None, memoryview | None]]:
        """(entry, bytes transferred, frame, source) that arrived (not yet verified). frame: handed out in
        place; else the bytes are in the mirror, or (source) are to be copied there from a mapping."""
        try:
            landed_now = self._plane.poll_landed()
        except TransportError as exc:
            raise PullFailedError(plan.version, str(exc)) from None
        owners = set(request_ids.values())
        for landed in landed_now:
            if landed.key in owners and landed.entry_index in pending:
                entry = pending[landed.entry_index]
                yield entry, entry.num_bytes, *self._read_landed(entry, landed.view)
        # Entries that land at request time (shared memory) leave nothing to wait for on the sockets.
        timeout_ms = 0 if not pending else 1 if self._plane.is_busy else 100
        for sock, _ in self._links.poller.poll(timeout_ms):
            if sock in self._links.monitors:
                self._links.check_handshake(sock, plan.version)
                continue
            shard = self._links.shard_of[sock]
            while (message := self._links.next(sock)) is not None:
                if getattr(message, "request_id", None) != request_ids.get(shard):
                    self._links.discard(sock)
                elif isinstance(message, PullError):
                    raise PullFailedError(plan.version, f"shard {shard}: {message.reason}")
                elif isinstance(message, PullChunk):
                    arrived = self._take_payload(sock, plan, message, pending)
                    if arrived is not None:
                        yield (*arrived, None)
                elif not isinstance(message, PullDone):
                    self._links.discard(sock)

    def _read_landed(self, entry: ManifestEntry, view: memoryview) -> tuple[memoryview | None, memoryview | None]:
        """(frame to hand out in place, mapped bytes still to copy into the mirror); both None when the
        transport wrote the mirror itself. At 7B most bytes are blocks of split tensors: copied here one
        after the other, they set the pull's pace (5 GB/s on an H200 host)."""
        if not self._plane.lands_in_place:
            return None, None
        if self._is_zero_copy(entry):
            return view, None
        return None, view

    def _take_payload(
        self, sock: zmq.Socket[bytes], plan: VersionPlan, chunk: PullChunk, pending: dict[int, ManifestEntry]
    ) -> tuple[ManifestEntry, int, memoryview | None] | None:
        entry = pending.get(chunk.entry_index)
        if entry is None or chunk.version != plan.version:
            self._links.discard(sock)
            return None
        try:
            if chunk.encoding == SPARSE:
                return entry, self._apply_sparse(sock, entry, chunk.num_bytes), None
            if chunk.encoding != DENSE:
                links.discard_rest(sock)
                raise ProtocolError(f"pull chunk of entry {entry.index} has unknown encoding {chunk.encoding}")
            if self._is_zero_copy(entry):
                return entry, entry.num_bytes, links.recv_payload_frame(sock, entry.num_bytes)
            links.recv_payload_into(sock, self.mirror.destination(entry))
        except (ProtocolError, DeltaError) as exc:
            self.mirror.forget(entry)
            raise PullFailedError(plan.version, str(exc)) from None
        return entry, entry.num_bytes, None

    def _apply_sparse(self, sock: zmq.Socket[bytes], entry: ManifestEntry, num_bytes: int) -> int:
        """Receive a sparse delta and apply it to the base bytes the mirror holds; bytes received."""
        if not self.mirror.holds_base(entry):
            links.discard_rest(sock)
            raise DeltaError(f"sparse chunk of entry {entry.index} ({entry.name}), not held as in the base version")
        if not 0 < num_bytes <= entry.num_bytes:
            links.discard_rest(sock)
            raise DeltaError(f"sparse chunk of {num_bytes} bytes for entry {entry.index} of {entry.num_bytes}")
        payload = memoryview(bytearray(num_bytes))
        links.recv_payload_into(sock, payload)
        apply_sparse(self.mirror.destination(entry), payload, entry.dtype)
        return num_bytes

    def _flush_dirty(self, plan: VersionPlan, counts: _Counts) -> Iterator[tuple[str, torch.Tensor]]:
        """Delta sync: re-hash the whole mirror against the manifest, then load tensors left dirty."""
        if plan.algorithm != NO_CHECKSUM:
            wrong = [e for e in plan.entries if checksum(self.mirror.entry_view(e)) != e.checksum]
            for entry in wrong:
                self.mirror.forget(entry)  # the retry fetches it again
            if wrong:
                names = sorted({e.name for e in wrong})
                raise PullFailedError(plan.version, f"reconstruction differs in {len(wrong)} entries: {names[:3]}")
        for name in self.mirror.take_dirty():
            counts.num_loaded += 1
            yield name, self._cast(self.mirror.tensor(name))

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.load_dtype is None or tensor.dtype == self.load_dtype:
            return tensor
        return tensor.to(self.load_dtype)


def _copy_then_check(destination: memoryview, source: memoryview, check: Callable[[], bool]) -> bool:
    """Copy a mapped entry into the mirror and check the copy (numpy's copy releases the GIL)."""
    np.copyto(np.frombuffer(destination, dtype=np.uint8), np.frombuffer(source, dtype=np.uint8))
    return check()


class _Counts:
    """How many entries of each tensor are still missing in this pull."""

    def __init__(self, needed: Sequence[ManifestEntry]) -> None:
        self._missing: dict[str, int] = {}
        for entry in needed:
            self._missing[entry.name] = self._missing.get(entry.name, 0) + 1
        self.num_loaded = 0

    def land(self, entry: ManifestEntry) -> bool:
        """Count a landed entry; True when its tensor is complete."""
        self._missing[entry.name] -= 1
        if self._missing[entry.name]:
            return False
        self.num_loaded += 1
        return True
