"""A rollout instance's part in KV offload and transfer (psrl.lmcache, routing_strategy.kv_transfer).

* Source: a request handed back for re-routing (migrate, preempted, sync, shutdown) leaves its
  whole blocks in the tier, where the instance's KV server hands them to whichever instance the
  router picks next; under ``pin_sync`` they are pinned until fetched (or the transfer timeout).
* Target: a re-routed request names its KV source; the instance fetches the blocks it could reuse
  (keys under its own weight version) straight from the source. ``async`` adds the request at once:
  its prefill runs in short chunks and before each takes the blocks that have landed, so only what
  had not arrived in time is re-prefilled; ``sync`` / ``pin_sync`` add it when the fetch ends or
  times out. Every fetch that lands nothing falls back to re-prefill, counted and logged.
* Reports: the tier's added and removed keys go to the router with every status tick.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from bus.messages import GenerateRequest, KvTierReport, KvTransferRecord
from psrl.config.coordination import KvTransfer
from psrl.kvcache.index import TierKey
from psrl.kvcache.tier import KvTier
from psrl.kvcache.transfer import FetchOutcome, KvFetcher, KvServer

REROUTE_REASONS = frozenset({"migrate", "preempted", "sync", "shutdown"})
# every this many status ticks the report is a full snapshot of the tier, so a router that lost a
# report (or restarted) stops under-counting this instance's tier; the other reports are changes only
SNAPSHOT_EVERY_TICKS = 64
CLOSE_JOIN_S = 1.0


@dataclass
class _Awaiting:
    request: GenerateRequest
    future: Future[FetchOutcome]
    deadline: float
    waits: bool  # sync / pin_sync: the request is added once the fetch ends


@dataclass
class KvPort:
    """What the flow needs of the KV side: the tier, and (with transfer on) the server and fetcher."""

    tier: KvTier
    server: KvServer | None = None
    fetcher: KvFetcher | None = None

    def close(self) -> None:
        """Stop serving and fetching, and wait (bounded) for both threads: a fetch still running when
        the process exits would hold the interpreter's exit for up to its timeout."""
        if self.fetcher is not None:
            self.fetcher.close()
        if self.server is not None:
            self.server.close()
        if self.fetcher is not None:
            self.fetcher.join(CLOSE_JOIN_S)


class InstanceKv:
    def __init__(self, name: str, port: KvPort, settings: KvTransfer, engine: Any) -> None:
        self.name = name
        self.port = port
        self.transfer = settings if settings.enable and port.fetcher is not None else None
        self.engine = engine
        self.timeout_s = settings.transfer_timeout_ms / 1000
        self.awaiting: dict[str, _Awaiting] = {}
        self.pins: dict[str, float] = {}  # pin owner (request id) -> when it lapses
        self.report_seq = 0
        self.num_ticks = 0
        self.sent_address = False

    # source side

    def exported(self, request_id: str, token_ids: list[int], reason: str, now: float) -> None:
        """A request left for re-routing: keep its blocks where a peer can fetch them."""
        if self.transfer is None or reason not in REROUTE_REASONS:
            return
        keys: list[TierKey] = self.engine.export_prefix_kv(token_ids)
        if keys and self.transfer.transfer_mode == "pin_sync":
            self.port.tier.pin(request_id, keys)
            self.pins[request_id] = now + self.timeout_s

    def expire_pins(self, now: float) -> None:
        for owner in [o for o, lapse in self.pins.items() if lapse <= now]:
            self.port.tier.unpin(owner)  # the target never came: the blocks may go
            del self.pins[owner]

    # target side

    def wants_fetch(self, request: GenerateRequest) -> bool:
        return (
            self.transfer is not None and bool(request.kv_source_address) and request.kv_source not in ("", self.name)
        )

    def start_fetch(self, request: GenerateRequest, token_ids: list[int], now: float) -> bool:
        """Start fetching ``request``'s blocks; True when the request must wait for the fetch. A request
        with no whole block to reuse fetches nothing (no round trip to the source, no wait)."""
        assert self.transfer is not None and self.port.fetcher is not None
        rid = str(request.request_id)
        mode = self.transfer.transfer_mode
        keys = self.engine.prefix_keys(token_ids)
        if not keys:
            return False
        pin = rid if mode == "pin_sync" else ""
        waits = mode != "async"
        future = self.port.fetcher.start(rid, request.kv_source_address, keys, self.timeout_s, pin, awaited=waits)
        self.awaiting[rid] = _Awaiting(request, future, now + self.timeout_s, waits)
        return waits

    def admitted_while_fetching(self, request_id: str) -> None:
        """An async fetch's request is in the engine: its prefill takes blocks as they land."""
        if request_id in self.awaiting:
            self.engine.expect_kv(request_id)

    def finished_fetches(self, now: float) -> tuple[list[GenerateRequest], list[KvTransferRecord]]:
        """Requests whose fetch ended (or timed out) and must now be added, and a record of each fetch."""
        ready: list[GenerateRequest] = []
        records: list[KvTransferRecord] = []
        for rid, waiting in list(self.awaiting.items()):
            done = waiting.future.done()
            if not done and now < waiting.deadline:
                continue
            del self.awaiting[rid]
            outcome = waiting.future.result() if done else None
            records.append(self._record(waiting.request, outcome))
            if waiting.waits:
                ready.append(waiting.request)
            else:
                self.engine.kv_arrived(rid)  # what landed is taken now; the rest is prefilled
        return ready, records

    def _record(self, request: GenerateRequest, outcome: FetchOutcome | None) -> KvTransferRecord:
        assert self.transfer is not None
        if outcome is None:
            outcome = FetchOutcome(str(request.request_id), 0, 0, self.timeout_s, "timed out")
        return KvTransferRecord(
            request_id=request.request_id,
            source=request.kv_source,
            target=self.name,
            mode=self.transfer.transfer_mode,
            num_blocks=outcome.num_blocks,
            num_bytes=outcome.num_bytes,
            seconds=outcome.seconds,
            error=outcome.error,
        )

    # reports

    def report(self) -> KvTierReport | None:
        """The tier's changes since the last report (None when there are none to tell), or every
        SNAPSHOT_EVERY_TICKS calls all the keys it holds."""
        self.num_ticks += 1
        tier = self.port.tier
        changes = tier.snapshot() if self.num_ticks % SNAPSHOT_EVERY_TICKS == 0 else tier.drain_changes()
        if not changes and self.sent_address:
            return None
        self.sent_address = True
        self.report_seq += 1
        address = "" if self.port.server is None else self.port.server.address
        return KvTierReport(
            instance=self.name,
            address=address,
            added=_key_array(changes.added),
            removed=_key_array(changes.removed),
            cleared=changes.cleared,
            report_seq=self.report_seq,
        )


def _key_array(keys: list[TierKey]) -> np.ndarray:
    return np.asarray(keys, dtype=np.int64).reshape(-1, 2)
