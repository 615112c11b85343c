"""POSIX shared memory on one host: a pull is a mapped read, a push one copy into the shard.

Each shard keeps every version buffer in its own file under ``/dev/shm`` (``psrl-ps-<pid>-...``)
and advertises, in its ``PushReady`` and ``ManifestReply`` offers, the file and each entry's byte
range. Push: the pusher maps the shard's incoming file and copies its tensors' bytes into it in
buckets, telling the shard after each bucket (``PushWritten``), so the shard verifies one bucket
while the next is copied (a push from the GPU is checked by the pusher instead, see
``ShmPushDataPlane``). Pull: the puller maps the file and hands the engine views of the shard's
own pages (whole tensors, no copy on the host); what it must keep (its delta-sync mirror, blocks of
split tensors) it copies out. As with NIXL's one-sided reads the shard cannot see a pull, so the
puller confirms with a ``LiveCheck`` afterwards that the version was not retired meanwhile (and
every entry is checked against its checksum before it is handed out).

ZeroMQ still carries every control message; across hosts use ``zmq`` or ``nixl`` (a puller that
cannot open the file fails its pull with a ``TransportError`` that says so). Files of shards that
died without cleaning up are removed by the next shard that starts on the host.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import mmap
import os
import re
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import msgspec
import numpy as np
import torch
import zmq

from psrl.log import get_logger
from psrl.processes import pid_alive
from psrl.ps import links, pinning
from psrl.ps.checksum import WORD_SUM_MASK, checksum, checksum_and_word_sum, word_sum
from psrl.ps.manifest import ManifestEntry
from psrl.ps.protocol import PushBegin, PushWritten, ShardPullRequest
from psrl.ps.staging import word_sum_on_device
from psrl.ps.transports.base import (
    BufferPool,
    DirectAccessShardPlane,
    EntryBuffers,
    Landed,
    PullDataPlane,
    PushDataPlane,
    TransportError,
)

PREFIX = "psrl-ps-"
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")
# A push tells the shard after every this many bytes, so copying and verifying overlap.
BUCKET_BYTES = 64 << 20
# Mappings a pusher or puller keeps open: every shard cycles through three or four files (incoming,
# latest, previous, a spare), and re-mapping (re-pinning) a file on every pull costs seconds at 7B.
MAX_MAPPINGS = 64
# An entry this large is hashed on one thread while others take its word sum in pieces: one thread doing
# both in one pass would be the push's tail (a 0.5B model's embedding is 272 MB)
SPLIT_SUM_BYTES = 32 << 20
SUM_PIECE_BYTES = 8 << 20  # a multiple of the word: only the last piece has a tail


def shm_directory() -> Path:
    """``$PSRL_SHM_DIR``, else ``/dev/shm`` where it exists (Linux), else the temporary directory."""
    chosen = os.environ.get("PSRL_SHM_DIR")
    if chosen:
        return Path(chosen)
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(os.environ.get("TMPDIR", "/tmp"))


class _ShmOffer(msgspec.Struct, array_like=True, frozen=True):
    path: str
    size: int
    ranges: dict[int, tuple[int, int]]  # entry index -> (byte offset, bytes)


class Segment:
    """One version buffer: a shared-memory file this process created, mapped read-write."""

    _numbers = itertools.count()

    def __init__(self, directory: Path, size: int) -> None:
        self.path = str(directory / f"{PREFIX}{os.getpid()}-{next(self._numbers)}-{uuid.uuid4().hex[:8]}")
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            _reserve(fd, self.path, size)
            self.map = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        self.size = size
        self.array = np.frombuffer(self.map, dtype=np.uint8)

    def unlink(self) -> None:
        """Remove the file; the memory goes once every mapping of it (here and in pullers) is gone."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _reserve(fd: int, path: str, size: int) -> None:
    """Give the file its pages now: a shared-memory file short of space would kill a writer (SIGBUS) later."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        free = os.statvfs(Path(path).parent)
        raise TransportError(
            f"cannot reserve {size / 1e9:.2f} GB of shared memory in {Path(path).parent} "
            f"({free.f_bavail * free.f_frsize / 1e9:.2f} GB free): {exc.strerror}. A shard holds up to four "
            "versions of its part; enlarge /dev/shm (docker: --shm-size) or set PSRL_SHM_DIR to a larger tmpfs"
        ) from None


def remove_stale_segments(directory: Path) -> int:
    """Delete segment files of processes that no longer exist on this host; returns how many."""
    removed = 0
    for path in directory.glob(f"{PREFIX}*"):
        match = _OWNED.match(path.name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


class _Mappings:
    """Files of other processes, mapped on first use and kept (up to ``MAX_MAPPINGS``, oldest dropped).

    ``pin``: register each read-only mapping with CUDA, so an engine's host-to-device copies of the
    views run at pinned-memory speed (registration costs once per file: shards reuse their files).
    """

    def __init__(self, writable: bool, pin: bool = False) -> None:
        self.writable = writable
        self.pin = pin
        self.num_pin_failures = 0
        self._maps: OrderedDict[str, memoryview] = OrderedDict()
        self._pinned: dict[str, int] = {}

    def view(self, path: str, size: int) -> memoryview:
        view = self._maps.get(path)
        if view is not None:
            self._maps.move_to_end(path)
            return view
        self._forget_removed()
        view = self._open(path, size)
        self._maps[path] = view
        if self.pin:
            self._register(path, view)
        while len(self._maps) > MAX_MAPPINGS:
            old, _ = self._maps.popitem(last=False)  # unmapped once no view of it is alive
            self._unregister(old)
        return view

    def _forget_removed(self) -> None:
        """Drop mappings of files their shard removed: a mapping would keep their memory alive."""
        for path in [p for p in self._maps if not os.path.exists(p)]:
            self._unregister(path)
            del self._maps[path]

    def _register(self, path: str, view: memoryview) -> None:
        address = pinning.register(view, read_only=not self.writable)
        if address is None:
            self.num_pin_failures += 1
            return
        self._pinned[path] = address

    def _unregister(self, path: str) -> None:
        address = self._pinned.pop(path, None)
        if address is not None:
            pinning.unregister(address)

    def _open(self, path: str, size: int) -> memoryview:
        name = Path(path).name
        if not name.startswith(PREFIX) or "/" in name:
            raise TransportError(f"shared-memory offer names {path!r}, not a psrl segment")
        try:
            fd = os.open(path, os.O_RDWR if self.writable else os.O_RDONLY)
        except FileNotFoundError:
            raise TransportError(
                f"shared-memory segment {path} is gone: the shard retired that version, or it runs on another "
                "host (psrl.ps.transport=shm works within one host; use zmq or nixl across hosts)"
            ) from None
        try:
            if os.fstat(fd).st_size != size:
                raise TransportError(
                    f"shared-memory segment {path} has {os.fstat(fd).st_size} bytes, offer says {size}"
                )
            # Pullers map copy-on-write (writable views for torch; no write can reach the shard), except
            # when the mapping is pinned: pinning a private mapping copies its pages, so a cached mapping
            # would keep the bytes of the version the file held first, never those of later versions the
            # shard writes into the same file. A pinned mapping is shared and read-only.
            access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ if self.pin else mmap.ACCESS_COPY
            return memoryview(mmap.mmap(fd, size, access=access))
        finally:
            os.close(fd)

    def clear(self) -> None:
        for path in list(self._pinned):
            self._unregister(path)
        self._maps.clear()


def _decode(offer: bytes) -> _ShmOffer:
    try:
        return msgspec.msgpack.decode(offer, type=_ShmOffer)
    except msgspec.DecodeError as exc:
        raise TransportError(f"malformed shared-memory offer: {exc}") from None


def _range(offer: _ShmOffer, entry: ManifestEntry) -> tuple[int, int]:
    found = offer.ranges.get(entry.index)
    if found is None or found[1] != entry.num_bytes or found[0] + found[1] > offer.size:
        raise TransportError(f"shared-memory offer has no valid range for entry {entry.index} ({entry.name})")
    return found


class ShmShardDataPlane(DirectAccessShardPlane):
    name: ClassVar[str] = "shm"

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or shm_directory()
        self.num_stale_removed = remove_stale_segments(self.directory)
        self._segments: dict[str, Segment] = {}
        # One spare, not two: a shared-memory version is a whole model part held in RAM.
        self.pool = BufferPool(max_spare=1, allocate=self._allocate)

    def _allocate(self, size: int) -> tuple[np.ndarray, Segment]:
        segment = Segment(self.directory, size)
        self._segments[segment.path] = segment
        return segment.array, segment

    def allocate(self, entries: Sequence[ManifestEntry]) -> EntryBuffers:
        return self.pool.take(entries)

    def _offer(self, buffers: EntryBuffers) -> bytes:
        segment: Segment = buffers.handle
        ranges = {i: (buffers.offsets[i], len(v)) for i, v in buffers.views.items()}
        return msgspec.msgpack.encode(_ShmOffer(segment.path, segment.size, ranges))

    def release(self, buffers: EntryBuffers) -> None:
        for evicted in self.pool.give(buffers):
            segment = self._segments.pop(evicted.handle.path, None)
            if segment is not None:
                segment.unlink()

    def close(self) -> None:
        for segment in self._segments.values():
            segment.unlink()
        self._segments.clear()


class _Bucket(NamedTuple):
    copied: Future[list[int]]  # the bucket's checksums when it hashes in place (else empty)
    written: PushWritten
    landing: _Landing | None = None  # device copies (they run even if the hash is cancelled)


class ShmPushDataPlane(PushDataPlane):
    """Copies run on a pool of threads, every shard's buckets at once: one thread copies about 10 GB/s,
    a large host's memory several times that. ``progress`` tells each shard about its buckets in order.

    From a CUDA device (``send_device``) there is no host copy at all: the shard's file is registered
    with CUDA once (its pages are locked; shards reuse their files), each bucket is copied straight
    into it by DMA, and a thread hashes the bucket in place as soon as its copies landed, checking
    each entry against the word sum its source took on the device in the same pass.
    """

    name: ClassVar[str] = "shm"
    copies_from_device: ClassVar[bool] = True

    def __init__(self, bucket_bytes: int = BUCKET_BYTES, num_threads: int | None = None) -> None:
        self.bucket_bytes = bucket_bytes
        self._maps = _Mappings(writable=True)
        self._registered = _Mappings(writable=True, pin=True)  # targets of device copies
        # every CPU: checking and hashing what landed is compute-bound (xxh3 and a word sum of each piece
        # in cache: 30 GB/s on 8 threads, 47 GB/s on 16 of an H200 host's, whose memory reads 67 GB/s)
        threads = num_threads or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ps-shm-push")
        self._sum_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ps-shm-sum")  # large entries
        self._sends: dict[int, tuple[zmq.Socket[bytes], deque[_Bucket]]] = {}
        self._sums: dict[int, int] = {}
        self._log = get_logger("psrl.ps.shm")

    def send(
        self,
        sock: zmq.Socket[bytes],
        begin: PushBegin,
        offer: bytes,
        payloads: Sequence[tuple[ManifestEntry, memoryview]],
    ) -> None:
        if not payloads:
            return
        shard = payloads[0][0].shard
        self.cancel(shard)  # copies of an earlier attempt finish before this one writes the same file
        remote = _decode(offer)
        target = self._maps.view(remote.path, remote.size)
        buckets: deque[_Bucket] = deque()
        for part in _buckets(payloads, self.bucket_bytes):
            copies = [(_slice(target, _range(remote, e)), view) for e, view in part]
            buckets.append(_Bucket(self._pool.submit(_copy_all, copies), _written(begin, part)))
        self._sends[shard] = (sock, buckets)

    def send_device(
        self, sock: zmq.Socket[bytes], begin: PushBegin, offer: bytes, entries: Sequence[ManifestEntry], weights: Any
    ) -> None:
        if not entries:
            return
        shard = entries[0].shard
        self.cancel(shard)
        remote = _decode(offer)
        on_cuda = any(w.device.type == "cuda" for w in weights.weights.values())
        target = (self._registered if on_cuda else self._maps).view(remote.path, remote.size)
        copier = _DeviceCopier(weights, take_sums=begin.checksums_follow)
        buckets: deque[_Bucket] = deque()
        for part in _buckets([(e, _slice(target, _range(remote, e))) for e in entries], self.bucket_bytes):
            landing = copier.copy(part)  # DMA copies queued on the device's stream; returns at once
            job = functools.partial(_hash_landed, landing, part, begin.checksums_follow, self._sum_pool)
            buckets.append(_Bucket(self._pool.submit(job), _written(begin, part), landing))
        self._sends[shard] = (sock, buckets)

    def take_checksums(self) -> dict[int, int]:
        sums, self._sums = self._sums, {}
        return sums

    def progress(self) -> list[int]:
        failed = []
        for shard, (sock, buckets) in list(self._sends.items()):
            while buckets and buckets[0].copied.done():
                bucket = buckets.popleft()
                error = bucket.copied.exception()
                if error is not None:
                    self._log.warning("ps.shm_copy_failed", shard=shard, error=str(error))
                    self.cancel(shard)
                    failed.append(shard)
                    break
                written, sums = bucket.written, bucket.copied.result()
                if sums:
                    written = msgspec.structs.replace(written, checksums=tuple(sums))
                    self._sums.update(zip(written.entry_indices, sums, strict=True))
                links.send(sock, written)
            if not buckets:
                self._sends.pop(shard, None)
        return failed

    @property
    def is_busy(self) -> bool:
        return bool(self._sends)

    def cancel(self, shard_key: int) -> None:
        """Forget a shard's unfinished buckets; returns once none of them can write any more (a queued
        device copy lands even when its hash is cancelled, so it is waited for)."""
        _, buckets = self._sends.pop(shard_key, (None, deque()))
        for bucket in buckets:
            if not bucket.copied.cancel():
                wait([bucket.copied])
            if bucket.landing is not None:
                bucket.landing.wait()

    def close(self) -> None:
        for shard in list(self._sends):
            self.cancel(shard)
        self._pool.shutdown(wait=True)
        self._sum_pool.shutdown(wait=True)
        self._maps.clear()
        self._registered.clear()


def _written(begin: PushBegin, part: Sequence[tuple[ManifestEntry, memoryview]]) -> PushWritten:
    return PushWritten(begin.version, begin.incarnation, begin.attempt, tuple(e.index for e, _ in part))


class _Landing(NamedTuple):
    """Copies of one bucket queued from the device: the event after them (None once done) and each
    entry's word sum taken on the device, in host memory once the event fired."""

    event: Any
    source_sums: torch.Tensor | None

    def wait(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return [] if self.source_sums is None else [s & WORD_SUM_MASK for s in self.source_sums.tolist()]


class _DeviceCopier:
    """Queues copies of entries from the trainer's tensors (cast on their device, one tensor at a time)
    into host memory; on a CPU the copies run at once. With ``take_sums`` it also takes each entry's
    word sum where the tensor lies, for the check of the bytes that landed."""

    def __init__(self, weights: Any, take_sums: bool) -> None:
        self.weights = weights
        self.take_sums = take_sums
        self._name = ""
        self._source: torch.Tensor | None = None

    def copy(self, part: Sequence[tuple[ManifestEntry, memoryview]]) -> _Landing:
        """Queue ``part``'s copies (and sums); what to wait on for them."""
        device = torch.device("cpu")
        sums = []
        for entry, destination in part:
            source = self._bytes_of(entry)
            start, end = entry.byte_range()
            host = torch.frombuffer(destination, dtype=torch.uint8)
            host.copy_(source[start:end], non_blocking=source.device.type == "cuda")
            if self.take_sums:
                sums.append(word_sum_on_device(source, start, end))
            device = source.device
        source_sums = torch.stack(sums) if sums else None
        if device.type != "cuda":
            return _Landing(None, source_sums)
        if source_sums is not None:  # into pinned memory behind the copies: ready when the event fired
            host_sums = torch.empty(source_sums.shape, dtype=source_sums.dtype, pin_memory=True)
            source_sums = host_sums.copy_(source_sums, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(device))
        return _Landing(event, source_sums)

    def _bytes_of(self, entry: ManifestEntry) -> torch.Tensor:
        if entry.name != self._name or self._source is None:  # a tensor's entries come one after another
            # The previous cast tensor goes back to the allocator here: its copies are queued on the same
            # stream, so nothing reuses that memory before they ran.
            self._name, self._source = entry.name, self.weights.cast(entry.name).reshape(-1).view(torch.uint8)
        return self._source


def _hash_landed(
    landing: _Landing, part: Sequence[tuple[ManifestEntry, memoryview]], hashing: bool, sum_pool: ThreadPoolExecutor
) -> list[int]:
    """Each entry's checksum, hashed where it landed once its copies did, after checking the landed
    bytes against the word sum its source took (a copy that wrote elsewhere, or had not landed,
    fails the bucket: the shard's attempt starts over)."""
    source_sums = landing.wait()
    if not hashing:
        return []
    sums = []
    for (entry, view), source_sum in zip(part, source_sums, strict=True):
        digest, landed_sum = _checksum_and_word_sum(view, sum_pool)
        if landed_sum != source_sum:
            raise TransportError(
                f"entry {entry.index} ({entry.name}) landed unlike its source: word sum {landed_sum:#x}, "
                f"source {source_sum:#x}"
            )
        sums.append(digest)
    return sums


def _checksum_and_word_sum(view: memoryview, sum_pool: ThreadPoolExecutor) -> tuple[int, int]:
    """``checksum_and_word_sum``; a large entry's word sum is taken in pieces on ``sum_pool`` while this thread
    hashes it."""
    if len(view) < SPLIT_SUM_BYTES:
        return checksum_and_word_sum(view)
    pieces = [
        sum_pool.submit(word_sum, view[start : start + SUM_PIECE_BYTES])
        for start in range(0, len(view), SUM_PIECE_BYTES)
    ]
    digest = checksum(view)
    return digest, sum(piece.result() for piece in pieces) & WORD_SUM_MASK


def _buckets(
    payloads: Sequence[tuple[ManifestEntry, memoryview]], bucket_bytes: int
) -> Iterator[list[tuple[ManifestEntry, memoryview]]]:
    """Consecutive payloads in groups of at least ``bucket_bytes`` (the last one smaller)."""
    bucket: list[tuple[ManifestEntry, memoryview]] = []
    filled = 0
    for entry, view in payloads:
        bucket.append((entry, view))
        filled += len(view)
        if filled >= bucket_bytes:
            yield bucket
            bucket, filled = [], 0
    if bucket:
        yield bucket


def _slice(target: memoryview, byte_range: tuple[int, int]) -> memoryview:
    offset, size = byte_range
    return target[offset : offset + size]


def _copy_all(copies: list[tuple[memoryview, memoryview]]) -> list[int]:
    for destination, source in copies:
        if len(destination) != len(source):
            raise TransportError(f"shared-memory range of {len(destination)} bytes for {len(source)}")
        # numpy copies without the GIL and on this thread only: the pool, not torch's threads, sets the parallelism
        np.copyto(np.frombuffer(destination, dtype=np.uint8), np.frombuffer(source, dtype=np.uint8))
    return []


class ShmPullDataPlane(PullDataPlane):
    name: ClassVar[str] = "shm"
    is_in_band: ClassVar[bool] = False
    lands_in_place: ClassVar[bool] = True

    def __init__(self, pin_memory: bool = False) -> None:
        self._maps = _Mappings(writable=False, pin=pin_memory)
        self._landed: list[Landed] = []

    @property
    def needs_live_check(self) -> bool:
        return True

    @property
    def reads_verified_memory(self) -> bool:
        # Only read-only shared mappings (pinned pulls): a copy-on-write view an engine wrote to would
        # keep its own pages, which only a checksum would catch.
        return self._maps.pin

    def request(
        self,
        sock: zmq.Socket[bytes],
        request: ShardPullRequest,
        offer: bytes,
        entries: Sequence[ManifestEntry],
        destinations: Sequence[memoryview],
    ) -> None:
        remote = _decode(offer)
        mapped = self._maps.view(remote.path, remote.size)
        for entry in entries:
            offset, size = _range(remote, entry)
            self._landed.append(Landed(request.request_id, entry.index, mapped[offset : offset + size]))

    def poll_landed(self) -> list[Landed]:
        landed, self._landed = self._landed, []
        return landed

    def finish(self, request_id: int) -> None:
        self._landed = [landed for landed in self._landed if landed.key != request_id]

    def close(self) -> None:
        self._landed.clear()
        self._maps.clear()
