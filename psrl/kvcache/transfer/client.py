"""The target side of KV transfer: fetch blocks from a source's KV server into the local tier.

Each fetch runs on a worker thread and ends with a ``FetchOutcome``: the blocks that landed (put
in the tier, under the source's version tags), or why none did. A source that dies or answers
late costs only the re-prefill the target would have done anyway.
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


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    transfer_id: str
    num_blocks: int  # blocks now in the local tier
    num_bytes: int
    seconds: float
    error: str = ""  # "" = the source answered (possibly with fewer blocks than asked)


class KvFetcher:
    def __init__(self, tier: KvTier, channel: Channel = "tcp", max_workers: int = 2) -> None:
        self.tier = tier
        self.channel = channel
        self._context: zmq.Context[Any] = zmq.Context.instance()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kv-fetch")
        self._landing: NixlLanding | None = None
        self._landing_lock = threading.Lock()  # one NIXL landing buffer: one NIXL fetch at a time

    def start(
        self, transfer_id: str, address: str, keys: list[tuple[int, int]], timeout_s: float, release_pin: str = ""
    ) -> Future[FetchOutcome]:
        return self._pool.submit(self.fetch, transfer_id, address, keys, timeout_s, release_pin)

    def fetch(
        self, transfer_id: str, address: str, keys: list[tuple[int, int]], timeout_s: float, release_pin: str = ""
    ) -> FetchOutcome:
        started = time.monotonic()
        try:
            if self.channel == "nixl":
                with self._landing_lock:
                    reply, payloads = self._fetch_nixl(transfer_id, address, keys, timeout_s, release_pin)
            else:
                request = FetchRequest(transfer_id, keys, "tcp", release_pin)
                reply, payloads = self._round_trip(address, request, timeout_s, None)
        except (TimeoutError, zmq.ZMQError, ValueError, RuntimeError) as exc:
            return FetchOutcome(transfer_id, 0, 0, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
        if reply.error:
            return FetchOutcome(transfer_id, 0, 0, time.monotonic() - started, reply.error)
        landed = 0
        for key, tokens, payload in zip(reply.keys, reply.token_ids, payloads, strict=True):
            if not self.tier.put((key[0], key[1]), tuple(tokens), payload):
                break
            landed += 1
        num_bytes = sum(p.numel() * p.element_size() for p in payloads[:landed])
        return FetchOutcome(transfer_id, landed, num_bytes, time.monotonic() - started)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._landing is not None:
            self._landing.close()

    def _fetch_nixl(
        self, transfer_id: str, address: str, keys: list[tuple[int, int]], timeout_s: float, release_pin: str
    ) -> tuple[FetchReply, list[torch.Tensor]]:
        if self._landing is None:
            self._landing = NixlLanding()
        landing = self._landing
        block_bytes = self._block_bytes()
        dst, size = landing.reserve(max(1, len(keys)) * block_bytes)
        request = FetchRequest(transfer_id, keys, "nixl", release_pin, landing.agent.name, landing.metadata, dst, size)
        return self._round_trip(address, request, timeout_s, landing.buffer)

    def _block_bytes(self) -> int:
        store = self.tier.store
        shape = getattr(store, "block_shape", None)
        dtype = getattr(store, "dtype", None)
        if shape is None or dtype is None:
            raise ValueError("a NIXL fetch needs a tier store with a fixed block shape")
        return int(torch.Size(shape).numel()) * int(dtype.itemsize)

    def _round_trip(
        self, address: str, request: FetchRequest, timeout_s: float, landing: torch.Tensor | None
    ) -> tuple[FetchReply, list[torch.Tensor]]:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(address)
            sock.send(ENCODER.encode(request))
            if not sock.poll(int(timeout_s * 1000)):
                raise TimeoutError(f"no answer from {address} within {timeout_s:.1f} s")
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
