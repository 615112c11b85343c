"""The target side of KV transfer: fetch blocks from a source's KV server into the local tier.

Each fetch runs on a worker thread and ends with a ``FetchOutcome``: the blocks that landed (put
in the tier, under the source's version tags), or why none did. A source that dies or answers
late costs only the re-prefill the target would have done anyway.

A fetch asks for its blocks in pieces of ``PIECE_BLOCKS``, in prefix order, and each piece goes
into the tier as soon as it lands: a target that started prefilling at once (async mode) takes the
leading blocks while later ones are still on their way. NIXL fetches land in slots of a pool
registered once (psrl.kvcache.transfer.nixl_channel), so fetches run side by side.
"""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from psrl.kvcache.tier import KvTier
from psrl.kvcache.transfer.nixl_channel import NixlLanding
from psrl.kvcache.transfer.wire import ENCODER, REPLY_DECODER, Channel, FetchReply, FetchRequest

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PIECE_BLOCKS = 16
ANSWER_POLL_MS = 50


class FetchFailedError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    transfer_id: str
    num_blocks: int  # blocks now in the local tier
    num_bytes: int
    seconds: float
    error: str = ""  # "" = the source answered every piece (possibly with fewer blocks than asked)


class KvFetcher:
    def __init__(
        self, tier: KvTier, channel: Channel = "tcp", max_workers: int = 2, piece_blocks: int = PIECE_BLOCKS
    ) -> None:
        self.tier = tier
        self.channel = channel
        self.piece_blocks = piece_blocks
        self.max_workers = max_workers
        self._context: zmq.Context[Any] = zmq.Context.instance()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kv-fetch")
        self._landing: NixlLanding | None = None
        self._landing_lock = threading.Lock()  # guards the pool's creation only
        self._closed = threading.Event()

    def start(
        self, transfer_id: str, address: str, keys: list[tuple[int, int]], timeout_s: float, release_pin: str = ""
    ) -> Future[FetchOutcome]:
        return self._pool.submit(self.fetch, transfer_id, address, keys, timeout_s, release_pin)

    def fetch(
        self, transfer_id: str, address: str, keys: list[tuple[int, int]], timeout_s: float, release_pin: str = ""
    ) -> FetchOutcome:
        """Fetch ``keys`` piece by piece until one comes back short; ``timeout_s`` bounds the whole fetch."""
        started = time.monotonic()
        deadline = started + timeout_s
        landed, num_bytes = 0, 0
        pieces = [keys[i : i + self.piece_blocks] for i in range(0, len(keys), self.piece_blocks)] or [[]]
        for piece in pieces:
            try:  # the source unpins what each piece served (all of it once a piece comes back short)
                count, size = self._fetch_piece(transfer_id, address, piece, deadline, release_pin)
            except FetchFailedError as failed:
                return FetchOutcome(transfer_id, landed, num_bytes, time.monotonic() - started, failed.reason)
            landed, num_bytes = landed + count, num_bytes + size
            if count < len(piece):
                break
        return FetchOutcome(transfer_id, landed, num_bytes, time.monotonic() - started)

    def close(self) -> None:
        """Stop: queued fetches are cancelled, running ones end at their next piece; nothing waits."""
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the fetch threads to end (after ``close``); then free the
        landing pool. False when a thread is still running (its pool is left to the process's exit)."""
        deadline = time.monotonic() + timeout_s
        threads = list(getattr(self._pool, "_threads", ()))
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            return False
        if self._landing is not None:
            self._landing.close()
        return True

    def _fetch_piece(
        self, transfer_id: str, address: str, keys: list[tuple[int, int]], deadline: float, release_pin: str
    ) -> tuple[int, int]:
        """One round trip; (blocks put in the tier, their bytes)."""
        if self._closed.is_set():
            raise FetchFailedError("the fetcher is closing")
        timeout_s = max(0.0, deadline - time.monotonic())
        try:
            if self.channel == "nixl":
                return self._fetch_nixl(transfer_id, address, keys, timeout_s, release_pin)
            request = FetchRequest(transfer_id, keys, "tcp", release_pin)
            reply, payloads = self._round_trip(address, request, timeout_s, None)
            return self._land(reply, payloads)
        except FetchFailedError:
            raise
        except Exception as exc:  # NIXL's errors subclass Exception only: a fetch ends in an outcome, never raises
            raise FetchFailedError(f"{type(exc).__name__}: {exc}") from exc

    def _land(self, reply: FetchReply, payloads: list[torch.Tensor]) -> tuple[int, int]:
        if reply.error:
            raise FetchFailedError(reply.error)
        landed = 0
        for key, tokens, payload in zip(reply.keys, reply.token_ids, payloads, strict=True):
            if not self.tier.put((key[0], key[1]), tuple(tokens), payload):
                break
            landed += 1
        return landed, sum(p.numel() * p.element_size() for p in payloads[:landed])

    def _fetch_nixl(
        self, transfer_id: str, address: str, keys: list[tuple[int, int]], timeout_s: float, release_pin: str
    ) -> tuple[int, int]:
        landing = self._landing_pool()
        slot = landing.acquire(len(keys) * self._block_bytes(), timeout_s)
        try:
            request = FetchRequest(transfer_id, keys, "nixl", release_pin, landing.agent.name, landing.metadata,
                                   slot.address, slot.size)  # fmt: skip
            reply, payloads = self._round_trip(address, request, timeout_s, slot.buffer)
            return self._land(reply, payloads)  # copied into the tier before the slot is reused
        finally:
            landing.release(slot)

    def _landing_pool(self) -> NixlLanding:
        with self._landing_lock:
            if self._landing is None:  # a slot per worker, each the size of a piece
                self._landing = NixlLanding(self.piece_blocks * self._block_bytes(), self.max_workers)
            return self._landing

    def _block_bytes(self) -> int:
        store = self.tier.store
        shape = getattr(store, "block_shape", None)
        dtype = getattr(store, "dtype", None)
        if shape is None or dtype is None:
            raise ValueError("a NIXL fetch needs a tier store with a fixed block shape")
        return int(torch.Size(shape).numel()) * int(dtype.itemsize)

    def _await_answer(self, sock: zmq.Socket[Any], address: str, timeout_s: float) -> None:
        """Wait for the source's answer in short slices, so that ``close`` ends a fetch promptly."""
        deadline = time.monotonic() + timeout_s
        while not sock.poll(ANSWER_POLL_MS):
            if self._closed.is_set():
                raise RuntimeError("the fetcher is closing")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no answer from {address} within {timeout_s:.1f} s")

    def _round_trip(
        self, address: str, request: FetchRequest, timeout_s: float, landing: torch.Tensor | None
    ) -> tuple[FetchReply, list[torch.Tensor]]:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(address)
            sock.send(ENCODER.encode(request))
            self._await_answer(sock, address, timeout_s)
            head, *frames = sock.recv_multipart(copy=False)
        finally:
            sock.close(0)
        reply = REPLY_DECODER.decode(head.buffer)
        if not reply.keys:
            return reply, []
        shape, dtype = torch.Size(reply.block_shape), DTYPES[reply.dtype]
        if landing is not None:
            flat = landing[: len(reply.keys) * shape.numel() * dtype.itemsize].view(dtype)
            return reply, list(flat.view(len(reply.keys), *shape).unbind(0))
        if len(frames) != len(reply.keys):
            raise ValueError(f"{len(reply.keys)} blocks announced, {len(frames)} frames received")
        with warnings.catch_warnings():  # read-only frames: the tier copies out of them before they go
            warnings.simplefilter("ignore", UserWarning)
            return reply, [torch.frombuffer(f.buffer, dtype=dtype).view(shape) for f in frames]
