"""The source side of KV transfer: a thread that serves tier blocks to peer instances.

It owns one ZeroMQ ROUTER socket (and, for the ``nixl`` channel, one NIXL agent) and reads only
the tier, which is thread-safe, so the rollout loop never waits for a peer. Blocks go straight
to the target: the router and the coordinator only ever see the server's address.
"""

from __future__ import annotations

import threading
from typing import Any

import structlog
import torch
import zmq

from psrl.kvcache.tier import KvTier
from psrl.kvcache.transfer.nixl_channel import NixlWriter
from psrl.kvcache.transfer.wire import ENCODER, REQUEST_DECODER, FetchReply, FetchRequest

log = structlog.get_logger(__name__)
POLL_MS = 100


class KvServer:
    def __init__(self, tier: KvTier, host: str = "127.0.0.1") -> None:
        self.tier = tier
        self._context: zmq.Context[Any] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._nixl: NixlWriter | None = None
        self._stop = threading.Event()
        self.num_served_blocks = 0
        self.num_bad_requests = 0
        self._thread = threading.Thread(target=self._serve, name="kv-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        if self._thread.is_alive():  # inside a write: its socket and staging buffer go with the process
            log.warning("kv_server_still_writing")
            return
        self._socket.close(0)
        if self._nixl is not None:
            self._nixl.close()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(POLL_MS):
                continue
            identity, *frames = self._socket.recv_multipart(copy=False)
            try:
                request = REQUEST_DECODER.decode(frames[0].buffer)
            except (msgspec_errors(), IndexError) as exc:
                self.num_bad_requests += 1
                log.warning("kv_fetch_malformed", error=str(exc))
                continue
            self._answer(identity, request)

    def _answer(self, identity: Any, request: FetchRequest) -> None:
        if request.channel == "nixl":
            keys, tokens, frames, meta, error = self._answer_nixl(request)
        else:
            keys, tokens, payloads = self._gather(request)
            frames = [p.contiguous().numpy().data.cast("B") for p in payloads]
            meta, error = _block_meta(payloads[0] if payloads else None), ""
        if request.release_pin:  # pin_sync: what is served (or will not be asked for) may go
            if len(keys) < len(request.keys):
                self.tier.unpin(request.release_pin)
            else:
                self.tier.unpin_keys(request.release_pin, keys)
        reply = FetchReply(request.transfer_id, keys, tokens, meta[0], meta[1], error)
        self._socket.send_multipart([identity, ENCODER.encode(reply), *frames], copy=False)
        self.num_served_blocks += len(keys)

    def _answer_nixl(
        self, request: FetchRequest
    ) -> tuple[list[tuple[int, int]], list[list[int]], list[Any], tuple[list[int], str], str]:
        """Copy the blocks once, from the tier into the registered staging buffer, and WRITE them."""
        try:
            writer = self._nixl_writer()
            writer.connect(request)  # also for a request of no keys: a fetcher warming up
            keys, tokens, first, nbytes = self._gather_into(writer, request)
            if keys:
                writer.write_staged(nbytes, request)
        except Exception as exc:  # NIXL's errors subclass Exception only; any of them must become an answer
            return [], [], [], ([], ""), f"nixl write failed: {type(exc).__name__}: {exc}"
        return keys, tokens, [], _block_meta(first), ""

    def _gather(self, request: FetchRequest) -> tuple[list[tuple[int, int]], list[list[int]], list[torch.Tensor]]:
        keys, tokens, payloads = [], [], []
        for version, block_hash in request.keys:
            entry = self.tier.read((version, block_hash))
            if entry is None:
                break  # only a gapless prefix is of use to the target
            keys.append((version, block_hash))
            tokens.append(list(entry[0]))
            payloads.append(entry[1])
        return keys, tokens, payloads

    def _gather_into(
        self, writer: NixlWriter, request: FetchRequest
    ) -> tuple[list[tuple[int, int]], list[list[int]], torch.Tensor | None, int]:
        """The blocks asked for (a gapless prefix) copied back to back into the writer's staging buffer;
        (keys, token ids, the first block as a shape/dtype sample, bytes staged)."""
        keys: list[tuple[int, int]] = []
        tokens: list[list[int]] = []
        sample = self.tier.peek_layout()
        if sample is None or not request.keys:
            return keys, tokens, None, 0
        block_bytes = sample.numel() * sample.element_size()
        room = min(len(request.keys), request.dst_bytes // block_bytes)
        staging = writer.stage(room * block_bytes)
        for index, key in enumerate(request.keys[:room]):
            out = staging[index * block_bytes : (index + 1) * block_bytes].view(sample.dtype).view(sample.shape)
            entry_tokens = self.tier.read_into(key, out)
            if entry_tokens is None:
                break
            keys.append(key)
            tokens.append(list(entry_tokens))
        return keys, tokens, sample, len(keys) * block_bytes

    def _nixl_writer(self) -> NixlWriter:
        if self._nixl is None:
            self._nixl = NixlWriter("kv-server")
        return self._nixl


def _block_meta(block: torch.Tensor | None) -> tuple[list[int], str]:
    """A block's shape and dtype name as the reply states them (empty without blocks)."""
    if block is None:
        return [], ""
    return list(block.shape), str(block.dtype).removeprefix("torch.")


def msgspec_errors() -> type[Exception]:
    import msgspec

    return msgspec.DecodeError
