"""A puller's links to every shard: its DEALER sockets, manifest requests and live checks.

``resolve(version)`` turns a version number (or ``LATEST``) into a ``VersionPlan``: the served
entries of every shard, checked to describe one version (one digest, every entry exactly once).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from bus.drops import is_sparse_log_point
from bus.security import CurveKeys
from psrl.ps import links
from psrl.ps.errors import PullFailedError
from psrl.ps.manifest import ManifestEntry, ManifestError, validate_served_parts
from psrl.ps.protocol import (
    LATEST,
    PROTOCOL_VERSION,
    WITH_PAYLOAD,
    LiveCheck,
    LiveReply,
    ManifestReply,
    ManifestRequest,
    Message,
    ProtocolError,
    Unavailable,
)


@dataclass(frozen=True)
class VersionPlan:
    version: int
    digest: bytes
    algorithm: str
    entries: tuple[ManifestEntry, ...]  # every shard's served entries, by index
    parts: list[ManifestReply]  # one per shard (its entries and transport offer)


# a handshake a shard refused: reported by the socket's monitor within milliseconds, where the request
# itself would only time out (the DEALER reconnects and is refused again, silently)
HANDSHAKE_FAILED: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "a security mismatch (one side uses CURVE, the other not, or other keys)",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "this process's key is not among the run's authorized keys",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the handshake failed",
}
# A connection cut mid-handshake (a shard killed or restarting) also reports "no detail"; only a shard
# that keeps failing it, reconnect after reconnect with no success between, is refusing.
VAGUE_FAILURES_TO_REFUSE = 3


class ShardLinks:
    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        pull_endpoints: Sequence[str],
        timeout_s: float,
        log: Any,
        curve: CurveKeys | None = None,
    ) -> None:
        self.num_shards = len(pull_endpoints)
        self.timeout_s = timeout_s
        self.socks = [links.make_dealer(ctx, ep, curve) for ep in pull_endpoints]
        self.shard_of = {sock: i for i, sock in enumerate(self.socks)}
        self.poller = zmq.Poller()
        for sock in self.socks:
            self.poller.register(sock, zmq.POLLIN)
        events = sum(HANDSHAKE_FAILED) | zmq.EVENT_HANDSHAKE_SUCCEEDED  # the flags the monitors report
        self.monitors = {sock.get_monitor_socket(events): i for i, sock in enumerate(self.socks)}
        for sock, endpoint in zip(self.socks, pull_endpoints, strict=True):
            # the first handshake may have failed before the monitor listened: connect again under it
            sock.disconnect(endpoint)
            sock.connect(endpoint)
        for monitor in self.monitors:
            self.poller.register(monitor, zmq.POLLIN)
        self.num_dropped = 0
        self._vague_failures = [0] * self.num_shards  # "no detail" failures since the last success
        self._request_ids = itertools.count(1)
        self._log = log

    def next_request_id(self) -> int:
        return next(self._request_ids)

    def close(self) -> None:
        for sock in self.socks:
            sock.disable_monitor()
            sock.close(linger=0)
        for monitor in self.monitors:
            monitor.close(linger=0)

    # receiving -----------------------------------------------------------------------------------

    def next(self, sock: zmq.Socket[bytes]) -> Message | None:
        """The next waiting message (its payload, if any, stays on the socket), skipping malformed ones."""
        while True:
            try:
                received = links.recv_message(sock, has_ident=False)
            except ProtocolError as exc:
                self.num_dropped += 1
                if is_sparse_log_point(self.num_dropped):
                    self._log.warning("ps.puller.malformed", count=self.num_dropped, detail=str(exc)[:200])
                continue
            return None if received is None else received[1]

    def discard(self, sock: zmq.Socket[bytes]) -> None:
        self.num_dropped += 1
        links.discard_rest(sock)

    def control(self, deadline: float, version: int) -> Iterator[tuple[int, Message]]:
        """Control messages that arrive before ``deadline`` (payloads of abandoned pulls are dropped)."""
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise PullFailedError(version, f"no reply from the PS within {self.timeout_s:.0f} s")
        for sock, _ in self.poller.poll(min(remaining_ms, 100)):
            if sock in self.monitors:
                self.check_handshake(sock, version)
                continue
            while (message := self.next(sock)) is not None:
                if isinstance(message, WITH_PAYLOAD):
                    self.discard(sock)
                else:
                    yield self.shard_of[sock], message

    def check_handshake(self, monitor: zmq.Socket[bytes], version: int) -> None:
        """A monitor's event: a refused handshake fails the request at once, saying why."""
        event, shard = int(recv_monitor_message(monitor)["event"]), self.monitors[monitor]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._vague_failures[shard] = 0
            return
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self._vague_failures[shard] += 1
            if self._vague_failures[shard] < VAGUE_FAILURES_TO_REFUSE:
                return
        why = HANDSHAKE_FAILED.get(event)
        if why is not None:
            raise PullFailedError(version, f"shard {shard} refused the handshake: {why}")

    # requests ------------------------------------------------------------------------------------

    def resolve(self, version: int) -> VersionPlan:
        """The served manifest of ``version`` (``LATEST``: shard 0's newest), consistent across shards."""
        if version == LATEST:
            first = self.manifest_from(0, LATEST)
            if isinstance(first, Unavailable):
                raise PullFailedError(version, "no version is committed yet", first.latest)
            version = first.version
        replies = self._manifests(version)
        digests = {r.digest for r in replies}
        if len(digests) != 1 or len({(r.num_entries, r.algorithm, r.num_shards) for r in replies}) != 1:
            raise PullFailedError(version, "shards disagree on the version's manifest")
        if replies[0].num_shards != self.num_shards:
            raise PullFailedError(version, f"PS has {replies[0].num_shards} shards, puller knows {self.num_shards}")
        try:
            validate_served_parts(version, [r.entries for r in replies], replies[0].num_entries)
        except ManifestError as exc:
            raise PullFailedError(version, str(exc)) from None
        entries = tuple(sorted((e for r in replies for e in r.entries), key=lambda e: e.index))
        return VersionPlan(version, replies[0].digest, replies[0].algorithm, entries, replies)

    def _manifests(self, version: int) -> list[ManifestReply]:
        ids = {}
        for shard, sock in enumerate(self.socks):
            ids[shard] = self.next_request_id()
            links.send(sock, ManifestRequest(ids[shard], version, PROTOCOL_VERSION))
        replies: dict[int, ManifestReply] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(replies) < self.num_shards:
            for shard, message in self.control(deadline, version):
                if getattr(message, "request_id", None) != ids[shard]:
                    continue
                if isinstance(message, Unavailable):
                    raise PullFailedError(version, f"shard {shard}: version {message.reason}", message.latest)
                if isinstance(message, ManifestReply):
                    _check_protocol(shard, message)
                    if message.version != version:
                        raise PullFailedError(version, f"shard {shard} answered for version {message.version}")
                    replies[shard] = message
        return [replies[s] for s in range(self.num_shards)]

    def manifest_from(self, shard: int, version: int) -> ManifestReply | Unavailable:
        request_id = self.next_request_id()
        links.send(self.socks[shard], ManifestRequest(request_id, version, PROTOCOL_VERSION))
        deadline = time.monotonic() + self.timeout_s
        while True:
            for got_shard, message in self.control(deadline, version):
                is_reply = isinstance(message, ManifestReply | Unavailable) and message.request_id == request_id
                if got_shard == shard and is_reply:
                    if isinstance(message, ManifestReply):
                        _check_protocol(shard, message)
                    return message  # type: ignore[return-value]

    def confirm_live(self, version: int) -> None:
        """Every shard must still serve ``version`` (after one-sided reads the shards could not see)."""
        ids = {}
        for shard, sock in enumerate(self.socks):
            ids[shard] = self.next_request_id()
            links.send(sock, LiveCheck(ids[shard], version))
        live: dict[int, bool] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(live) < self.num_shards:
            for shard, message in self.control(deadline, version):
                if isinstance(message, LiveReply) and message.request_id == ids[shard]:
                    live[shard] = message.is_live
        if not all(live.values()):
            raise PullFailedError(version, "version retired during the pull")


def _check_protocol(shard: int, reply: ManifestReply) -> None:
    if reply.protocol != PROTOCOL_VERSION:
        raise PullFailedError(
            reply.version,
            f"shard {shard} speaks PS protocol {reply.protocol}, this puller {PROTOCOL_VERSION} "
            "(run one psrl version on shards and rollout hosts)",
        )
