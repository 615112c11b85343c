"""Trainer side: push a version to every shard in parallel, then commit it (two phases).

Phase 1 (transfer): ``PushBegin`` to every shard, then each shard's entries as soon as it is
ready; a shard acknowledges once every entry landed and verified. A shard that restarts, reports a
checksum failure or stops answering status probes gets its part again (``attempt`` + 1) until the
push deadline. Phase 2 (commit): every shard but shard 0 is committed first, then shard 0, whose
commit hook announces the version. A shard that lost the version before committing (it restarted)
is refilled from the tensors still held here and committed again. Nothing is published unless every
shard holds the version completely.

A push of ``DeviceWeights`` on shared memory writes straight from the GPU into each shard's file
and hashes every bucket there once its copies landed, so its checksums follow the bytes
(``PushWritten.checksums``) and the digest comes last (``PushSealed``, once every shard's entries are
hashed). In the same pass over the landed bytes it checks each entry against a word sum taken on the
GPU from the tensor it was copied from (``source_checked``: an end-to-end check of the copy, so the
shards adopt the checksums instead of reading every byte again); a retry after sealing carries the
checksums in its begin and is verified by the shards as usual. Checksums that do not match what a
shard holds are never published: the push fails once its attempts are spent.

The tensors must not change until ``push`` returns (the payload frames view them in place).
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import zmq

from bus.security import CurveKeys
from psrl.log import get_logger
from psrl.ps import links
from psrl.ps.errors import PushFailedError, PushRefusedError
from psrl.ps.manifest import Manifest, ManifestEntry, build_manifest, entry_bytes, with_sums
from psrl.ps.plan import ShardPlan, TensorSpec, plan_shards
from psrl.ps.protocol import (
    Commit,
    CommitRefused,
    Committed,
    Message,
    ProtocolError,
    PushAbort,
    PushAck,
    PushBegin,
    PushReady,
    PushRefused,
    PushSealed,
    ShardStatus,
    StatusRequest,
)
from psrl.ps.staging import DeviceWeights, HostStaging, on_device
from psrl.ps.transports import PushDataPlane, push_plane
from psrl.ps.verify import host_threads

MAX_ATTEMPTS_PER_SHARD = 8


class _Stage(enum.IntEnum):
    BEGIN_SENT = 0
    SENDING = 1
    ACKED = 2
    COMMIT_SENT = 3
    COMMITTED = 4


@dataclass
class _ShardLink:
    shard: int
    sock: zmq.Socket[bytes]
    stage: _Stage = _Stage.BEGIN_SENT
    attempt: int = 0
    boot_id: str = ""
    begin: PushBegin | None = None
    last_heard: float = 0.0
    last_probe: float = 0.0
    may_commit: bool = False
    sealed: bool = False  # PushSealed sent for this attempt


@dataclass(frozen=True)
class PushResult:
    version: int
    digest: bytes
    num_bytes: int
    num_entries: int
    serialize_s: float
    transfer_s: float
    commit_s: float
    num_restarts: int
    shard_bytes: list[int] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.serialize_s + self.transfer_s + self.commit_s


class Pusher:
    def __init__(
        self,
        push_endpoints: Sequence[str],
        incarnation: int,
        *,
        transport: str = "zmq",
        max_block_bytes: int = 16 << 20,
        with_checksums: bool = True,
        timeout_s: float = 120.0,
        probe_interval_s: float = 1.0,
        host: str = "127.0.0.1",
        ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
        curve: CurveKeys | None = None,
    ) -> None:
        self.incarnation = incarnation
        self.num_shards = len(push_endpoints)
        self.max_block_bytes = max_block_bytes
        self.with_checksums = with_checksums
        self.timeout_s = timeout_s
        self.probe_interval_s = probe_interval_s
        self.num_hash_threads = host_threads()
        self._log = get_logger("psrl.ps.pusher", incarnation=incarnation)
        self._plane: PushDataPlane = push_plane(transport, host=host)
        self._own_ctx = ctx is None
        self._closed = False
        # One I/O thread per shard link (up to 4), so shards' streams are copied in parallel.
        self._ctx = ctx or zmq.Context(io_threads=min(4, max(1, len(push_endpoints))))
        self._links = [_ShardLink(i, links.make_dealer(self._ctx, ep, curve)) for i, ep in enumerate(push_endpoints)]
        self._by_sock = {link.sock: link for link in self._links}
        self._poller = zmq.Poller()
        for link in self._links:
            self._poller.register(link.sock, zmq.POLLIN)
        self._plan: ShardPlan | None = None
        self._plan_specs: list[TensorSpec] = []
        self._probe_ids = 0
        self._streams: dict[torch.device, torch.cuda.Stream] = {}  # pushes of snapshots (push_weights(after=))

    # public -------------------------------------------------------------------------------------

    def push(
        self,
        version: int,
        tensors: Mapping[str, torch.Tensor] | DeviceWeights,
        ready: Callable[[str], None] | None = None,
    ) -> PushResult:
        """Push ``tensors`` as ``version`` and commit it on every shard; raises a RequestError subclass.

        ``ready(name)`` blocks until a tensor's bytes are there (``HostStaging.stage(wait=False)``):
        each is hashed as soon as it landed, while the others are still being copied.
        ``DeviceWeights`` (transports that ``copies_from_device``): the transport copies each tensor from
        its device straight into the shard's memory and hashes it there; the checksums follow the bytes.
        """
        start = time.perf_counter()
        job = self._prepare(version, tensors, ready)
        serialized = time.perf_counter()
        job.deadline = serialized + self.timeout_s
        try:
            for link in self._links:
                link.attempt, link.boot_id, link.may_commit = 0, "", False
                self._begin(job, link)
            self._drive(job, lambda: all(link.stage >= _Stage.ACKED for link in self._links))
            transferred = time.perf_counter()
            self._commit_all(job)
        except BaseException:
            self._abort(version)
            raise
        done = time.perf_counter()
        self._log.info("ps.pushed", version=version, bytes=job.manifest.total_bytes, restarts=job.num_restarts)
        return PushResult(
            version=version,
            digest=job.digest,
            num_bytes=job.manifest.total_bytes,
            num_entries=len(job.manifest.entries),
            serialize_s=serialized - start,
            transfer_s=transferred - serialized,
            commit_s=done - transferred,
            num_restarts=job.num_restarts,
            shard_bytes=job.plan.shard_bytes(),
        )

    def push_weights(
        self,
        version: int,
        weights: Mapping[str, torch.Tensor],
        staging: HostStaging,
        *,
        after: torch.cuda.Event | None = None,
    ) -> PushResult:
        """Push a trainer's weights: straight from its GPU into the shards' memory where the transport
        can (shared memory), else through ``staging``'s host buffers.

        ``after``: the event recorded once ``weights`` were written on the device (a ``WeightSnapshot`` taken
        on the trainer's stream). The push's copies then wait for it on a stream of the pusher's own, so a
        push from another thread neither queues behind the trainer's next kernels nor runs ahead of them."""
        if after is not None and on_device(weights):
            device = next(iter(weights.values())).device
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            stream.wait_event(after)
            with torch.cuda.stream(stream):
                return self.push_weights(version, weights, staging)
        if self.copies_from_device and on_device(weights):
            return self.push(version, DeviceWeights(weights, staging.cast_to))
        return self.push(version, staging.stage(weights, wait=False), staging.wait_for)

    @property
    def copies_from_device(self) -> bool:
        """Whether ``push`` takes ``DeviceWeights`` (no host staging needed)."""
        return self._plane.copies_from_device

    def _prepare(
        self, version: int, tensors: Mapping[str, torch.Tensor] | DeviceWeights, ready: Callable[[str], None] | None
    ) -> _PushJob:
        if isinstance(tensors, DeviceWeights):
            if not self._plane.copies_from_device:
                raise ValueError(f"the {self._plane.name} transport pushes from host memory: stage the weights")
            plan = self.plan_for(tensors.meta)
            deferred = self.with_checksums
            manifest = build_manifest(version, plan, tensors.meta, with_checksums=False, deferred=deferred)
            return _PushJob(version, b"" if deferred else manifest.digest(), plan, manifest, [], device=tensors,
                        deferred=deferred)  # fmt: skip
        plan = self.plan_for(tensors)
        manifest = build_manifest(
            version, plan, tensors, with_checksums=self.with_checksums, num_threads=self.num_hash_threads, ready=ready
        )
        if ready is not None:  # without checksums nothing waited yet; the sends read every tensor
            for name in tensors:
                ready(name)
        payloads = [[(e, entry_bytes(tensors, e)) for e in manifest.shard_part(s)] for s in range(self.num_shards)]
        return _PushJob(version, manifest.digest(), plan, manifest, payloads)

    def plan_for(self, tensors: Mapping[str, torch.Tensor]) -> ShardPlan:
        """The sharding plan of this layout (computed once, reused while the layout is unchanged)."""
        specs = [TensorSpec.of(name, t) for name, t in tensors.items()]
        if self._plan is None or specs != self._plan_specs:
            self._plan = plan_shards(specs, self.num_shards, self.max_block_bytes)
            self._plan_specs = specs
        return self._plan

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._plane.close()
        for link in self._links:
            link.sock.close(linger=0)
        if self._own_ctx:
            self._ctx.term()

    # phases -------------------------------------------------------------------------------------

    def _begin(self, job: _PushJob, link: _ShardLink) -> None:
        if link.attempt >= MAX_ATTEMPTS_PER_SHARD:
            raise PushFailedError(job.version, f"shard {link.shard} failed {link.attempt} attempts")
        if link.attempt > 0:
            job.num_restarts += 1
            self._plane.cancel(link.shard)
        link.attempt += 1
        link.stage = _Stage.BEGIN_SENT
        link.sealed = False
        link.begin = PushBegin(
            version=job.version,
            incarnation=self.incarnation,
            attempt=link.attempt,
            digest=job.digest,
            num_shards=self.num_shards,
            num_entries=len(job.manifest.entries),
            algorithm=job.manifest.algorithm,
            entries=job.manifest.shard_part(link.shard),
            peer=self._plane.peer,
            checksums_follow=job.awaits_checksums,
            source_checked=job.awaits_checksums,  # send_device checks what it hashes (ShmPushDataPlane)
        )
        link.last_heard = time.monotonic()
        links.send(link.sock, link.begin)

    def _seal_all(self, job: _PushJob) -> None:
        for link in self._links:
            if link.stage == _Stage.SENDING:
                self._seal(job, link)

    def _seal(self, job: _PushJob, link: _ShardLink) -> None:
        """Send the digest to a shard whose attempt started with its checksums to follow, once known."""
        begin = link.begin
        if job.awaits_checksums or link.sealed or begin is None or not begin.checksums_follow:
            return
        link.sealed = True
        links.send(link.sock, PushSealed(job.version, self.incarnation, link.attempt, job.digest))

    def _commit_all(self, job: _PushJob) -> None:
        # Shard 0 last: its commit is the announcement, so every other shard must already serve v.
        for group in ([link for link in self._links if link.shard != 0], [self._links[0]]):
            for link in group:
                link.may_commit = True
                self._send_commit(job, link)
            self._drive(job, functools.partial(_all_committed, group))

    def _send_commit(self, job: _PushJob, link: _ShardLink) -> None:
        link.stage = _Stage.COMMIT_SENT
        link.last_heard = time.monotonic()
        links.send(link.sock, Commit(job.version, self.incarnation))

    def _abort(self, version: int) -> None:
        for link in self._links:
            try:
                links.send(link.sock, PushAbort(version, self.incarnation))
            except zmq.ZMQError:
                continue

    def _drive(self, job: _PushJob, is_done: Callable[[], bool]) -> None:
        """Handle replies until ``is_done()`` holds; restarts shards that fail or restart."""
        while not is_done():
            if time.perf_counter() > job.deadline:
                stuck = [link.shard for link in self._links if link.stage < _Stage.ACKED]
                raise PushFailedError(job.version, f"timed out; shards not done: {stuck}")
            for shard in self._plane.progress():
                self._log.warning("ps.pusher.transport_failed", shard=shard, version=job.version)
                self._begin(job, self._links[shard])
            if job.awaits_checksums and job.absorb(self._plane.take_checksums()):
                self._seal_all(job)
            timeout_ms = 1 if self._plane.is_busy else 50
            for sock, _ in self._poller.poll(timeout_ms):
                self._drain(job, self._by_sock[sock])
            self._probe_silent(job)

    def _drain(self, job: _PushJob, link: _ShardLink) -> None:
        while True:
            try:
                received = links.recv_message(link.sock, has_ident=False)
            except ProtocolError as exc:
                self._log.warning("ps.pusher.malformed", shard=link.shard, detail=str(exc))
                continue
            if received is None:
                return
            links.discard_rest(link.sock)  # shards send the pusher no payloads
            link.last_heard = time.monotonic()
            self._on_reply(job, link, received[1])

    def _on_reply(self, job: _PushJob, link: _ShardLink, message: Message) -> None:
        if isinstance(message, PushReady | PushAck | PushRefused) and (
            message.version != job.version or message.attempt != link.attempt
        ):
            return  # a reply to an earlier attempt
        if isinstance(message, PushReady) and link.stage == _Stage.BEGIN_SENT and link.begin is not None:
            link.stage, link.boot_id = _Stage.SENDING, message.boot_id
            if job.device is None:
                self._plane.send(link.sock, link.begin, message.offer, job.payloads[link.shard])
                return
            self._plane.send_device(link.sock, link.begin, message.offer, link.begin.entries, job.device)
            self._seal(job, link)  # an attempt begun before the push was sealed and answered after
        elif isinstance(message, PushRefused):
            raise PushRefusedError(job.version, message.reason, message.latest_version, message.max_incarnation)
        elif isinstance(message, PushAck) and link.stage in (_Stage.BEGIN_SENT, _Stage.SENDING):
            self._on_ack(job, link, message)
        elif isinstance(message, Committed) and message.version == job.version:
            link.stage = _Stage.COMMITTED
        elif isinstance(message, CommitRefused) and message.version == job.version:
            self._log.warning("ps.pusher.refill", shard=link.shard, version=job.version, reason=message.reason)
            self._begin(job, link)
        elif isinstance(message, ShardStatus):
            self._on_status(job, link, message)

    def _on_ack(self, job: _PushJob, link: _ShardLink, ack: PushAck) -> None:
        if ack.is_ok:
            link.stage = _Stage.ACKED
            if link.may_commit:
                self._send_commit(job, link)
            return
        self._log.warning("ps.pusher.shard_retry", shard=link.shard, version=job.version, reason=ack.reason)
        self._begin(job, link)

    def _on_status(self, job: _PushJob, link: _ShardLink, status: ShardStatus) -> None:
        if link.stage in (_Stage.BEGIN_SENT, _Stage.COMMITTED):
            return
        if status.latest == job.version:
            link.stage = _Stage.COMMITTED if link.stage == _Stage.COMMIT_SENT else link.stage
            return
        restarted = bool(link.boot_id) and status.boot_id != link.boot_id
        lost = status.incoming != job.version or status.counters.get("incoming_attempt") != link.attempt
        if restarted or lost:
            self._log.warning("ps.pusher.shard_lost_push", shard=link.shard, version=job.version, restarted=restarted)
            self._begin(job, link)

    def _probe_silent(self, job: _PushJob) -> None:
        now = time.monotonic()
        for link in self._links:
            if link.stage in (_Stage.ACKED, _Stage.COMMITTED):
                continue
            silent_for = now - max(link.last_heard, link.last_probe)
            if silent_for < self.probe_interval_s:
                continue
            if link.stage == _Stage.BEGIN_SENT and link.begin is not None:
                # The begin may have been lost with a shard that went down: send the same attempt again
                # (the pipe is ordered, so a duplicate begin always precedes this attempt's chunks).
                link.last_heard = now
                links.send(link.sock, link.begin)
                continue
            self._probe_ids += 1
            link.last_probe = now
            links.send(link.sock, StatusRequest(self._probe_ids))


def _all_committed(group: list[_ShardLink]) -> bool:
    return all(link.stage == _Stage.COMMITTED for link in group)


@dataclass
class _PushJob:
    version: int
    digest: bytes  # empty until every checksum is known (a deferred push)
    plan: ShardPlan
    manifest: Manifest
    payloads: list[list[tuple[ManifestEntry, memoryview]]]  # host bytes per shard (empty for device pushes)
    device: DeviceWeights | None = None
    deferred: bool = False  # the transport hashes each entry where it wrote it; checksums follow
    deadline: float = 0.0
    num_restarts: int = 0
    sums: dict[int, int] = field(default_factory=dict)

    @property
    def awaits_checksums(self) -> bool:
        return self.deferred and not self.digest

    def absorb(self, sums: Mapping[int, int]) -> bool:
        """Take checksums hashed in place; True once the last one came (the manifest is then complete)."""
        self.sums.update(sums)
        if len(self.sums) < len(self.manifest.entries):
            return False
        self.manifest = with_sums(self.manifest, self.sums)
        self.digest = self.manifest.digest()
        return True
