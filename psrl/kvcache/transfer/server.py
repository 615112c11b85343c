"""The source side of KV transfer: a thread that serves tier blocks to peer instances.

It owns one ZeroMQ ROUTER socket (and, for the ``nixl`` channel, one NIXL agent) and reads only
the tier, which is thread-safe, so the rollout loop never waits for a peer. Blocks go straight
to the target: the router and the coordinator only ever see the server's address.

``tcp``: the blocks go out of the tier's own memory, without a copy: the tier lends them (LMCache
keeps them allocated, evicted or not) until ZeroMQ reports it has sent them, one frame per run of
adjacent blocks. At most the store's ``lend_headroom_blocks`` are out at once; past that a reply
is copied out of the tier into a buffer of its own (reused once sent: a fresh buffer of tens of MiB
costs a page fault per 4 KiB on first touch, as much again as the copy). ``nixl``: the blocks are
copied once, into the writer's registered staging buffer, and written in one go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog
import torch
import zmq

from psrl.kvcache.tier import KvTier
from psrl.kvcache.transfer.nixl_channel import NixlWriter
from psrl.kvcache.transfer.wire import ENCODER, REQUEST_DECODER, FetchReply, FetchRequest

log = structlog.get_logger(__name__)
POLL_MS = 100
REPLY_BUFFERS = 4  # kept for reuse; more replies in flight at once get buffers of their own


class ReplyBuffers:
    """Buffers for ``tcp`` replies, each reused once ZeroMQ has finished sending it."""

    def __init__(self, keep: int = REPLY_BUFFERS) -> None:
        self.keep = keep
        self._sent: list[tuple[torch.Tensor, zmq.MessageTracker | None]] = []

    def take(self, nbytes: int) -> torch.Tensor:
        for index, (buffer, tracker) in enumerate(self._sent):
            if buffer.numel() >= nbytes and (tracker is None or tracker.done):
                del self._sent[index]
                return buffer[:nbytes]
        return torch.empty(1 << max(0, nbytes - 1).bit_length(), dtype=torch.uint8)[:nbytes]

    def sent(self, buffer: torch.Tensor, tracker: zmq.MessageTracker | None) -> None:
        """``buffer`` (from ``take``) is in flight until ``tracker`` is done."""
        whole = buffer if buffer._base is None else buffer._base
        self._sent.append((whole, tracker))
        if len(self._sent) > self.keep:  # the oldest goes (ZeroMQ still holds it while sending)
            self._sent.pop(0)


class KvServer:
    def __init__(self, tier: KvTier, host: str = "127.0.0.1", port: int = 0) -> None:
        """``port`` 0: any free port (``address`` says which)."""
        self.tier = tier
        self._context: zmq.Context[Any] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if port:
            self._socket.bind(f"tcp://{host}:{port}")
        else:
            port = self._socket.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._nixl: NixlWriter | None = None
        self._buffers = ReplyBuffers()
        self._lent: list[tuple[list[zmq.MessageTracker], Callable[[], None], int]] = []
        self._lend_limit = int(getattr(tier.store, "lend_headroom_blocks", 0))
        self._stop = threading.Event()
        self.num_served_blocks = 0
        self.num_bad_requests = 0
        self.num_failed_requests = 0
        self._thread = threading.Thread(target=self._serve, name="kv-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        if self._thread.is_alive():  # inside a write: its socket and staging buffer go with the process
            log.warning("kv_server_still_writing")
            return
        self._socket.close(0)
        self._return_lent(wait=True)
        if self._nixl is not None:
            self._nixl.close()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(POLL_MS):
                self._return_lent(wait=False)
                continue
            identity, *frames = self._socket.recv_multipart(copy=False)
            try:
                request = REQUEST_DECODER.decode(frames[0].buffer)
            except (msgspec_errors(), IndexError) as exc:
                self.num_bad_requests += 1
                log.warning("kv_fetch_malformed", error=str(exc))
                continue
            try:
                self._answer(identity, request)
            except Exception as exc:  # one bad request must not end the thread, and with it every later fetch
                self.num_failed_requests += 1
                log.warning("kv_fetch_failed", transfer_id=request.transfer_id, error=repr(exc))
                failed = FetchReply(request.transfer_id, [], [], [], "", f"{type(exc).__name__}: {exc}", request.seq)
                self._socket.send_multipart([identity, ENCODER.encode(failed)], copy=False)

    def _answer(self, identity: Any, request: FetchRequest) -> None:
        self._return_lent(wait=False)
        frames: list[torch.Tensor] = []
        release = None
        if request.channel == "nixl":
            keys, tokens, meta, error = self._answer_nixl(request)
        elif self._lendable(len(request.keys)):
            keys, tokens, frames, release, meta = self._lend(request)
            error = ""
        else:
            keys, tokens, buffer, meta = self._gather(request)
            frames, error = ([] if buffer is None else [buffer]), ""
        if request.release_pin:  # pin_sync: what is served (or will not be asked for) may go
            if len(keys) < len(request.keys):
                self.tier.unpin(request.release_pin)
            else:
                self.tier.unpin_keys(request.release_pin, keys)
        reply = ENCODER.encode(FetchReply(request.transfer_id, keys, tokens, meta[0], meta[1], error, request.seq))
        self._socket.send_multipart([identity, reply], zmq.SNDMORE if frames else 0, copy=False)
        trackers = [self._socket.send(frame.numpy(), zmq.SNDMORE if i < len(frames) - 1 else 0, copy=False, track=True)
                    for i, frame in enumerate(frames)]  # fmt: skip
        if release is not None:
            self._lent.append((trackers, release, len(keys)))
        elif frames:
            self._buffers.sent(frames[0], trackers[0])
        self.num_served_blocks += len(keys)

    def _lendable(self, num_blocks: int) -> bool:
        return num_blocks <= self._lend_limit - sum(count for _, _, count in self._lent)

    def _lend(
        self, request: FetchRequest
    ) -> tuple[list[tuple[int, int]], list[list[int]], list[torch.Tensor], Callable[[], None], tuple[list[int], str]]:
        tokens, views, release = self.tier.lend_many(list(request.keys))
        keys = list(request.keys[: len(tokens)])
        return keys, [list(t) for t in tokens], views, release, _block_meta(self.tier.peek_layout() if keys else None)

    def _return_lent(self, wait: bool) -> None:
        """Hand back to the tier the blocks whose sends are done (all of them when ``wait``: the
        socket is closed by then, so ZeroMQ has dropped what it had not sent)."""
        still = []
        for trackers, release, count in self._lent:
            if wait or all(tracker.done for tracker in trackers):
                release()
            else:
                still.append((trackers, release, count))
        self._lent = still

    def _answer_nixl(
        self, request: FetchRequest
    ) -> tuple[list[tuple[int, int]], list[list[int]], tuple[list[int], str], str]:
        """WRITE the blocks into the regions the target reserved for them: from where they lie in the
        tier's buffer when the store lends them, else copied once into the registered staging buffer."""
        try:
            writer = self._nixl_writer()
            writer.connect(request)  # also for a request of no keys: a fetcher warming up
            room = min(len(request.keys), len(request.dst_regions))
            memory = getattr(self.tier.store, "memory", None)
            if memory is None:
                keys, tokens, sample, nbytes = self._gather_into(writer, request, room)
                if keys:
                    writer.write_staged(nbytes, request)
                return keys, tokens, _block_meta(sample), ""
            writer.register(memory)
            tokens_read, views, release = self.tier.lend_many(list(request.keys[:room]))
            try:
                if tokens_read:
                    writer.write_regions([(int(v.data_ptr()), v.numel()) for v in views], request)
            finally:
                release()
            keys = list(request.keys[: len(tokens_read)])
            return keys, [list(t) for t in tokens_read], _block_meta(self.tier.peek_layout() if keys else None), ""
        except Exception as exc:  # NIXL's errors subclass Exception only; any of them must become an answer
            return [], [], ([], ""), f"nixl write failed: {type(exc).__name__}: {exc}"

    def _gather(
        self, request: FetchRequest
    ) -> tuple[list[tuple[int, int]], list[list[int]], torch.Tensor | None, tuple[list[int], str]]:
        """The blocks asked for (a gapless prefix) back to back in one reply buffer; (keys, token ids,
        the buffer's bytes in use or None, block shape and dtype)."""
        sample = self.tier.peek_layout()
        if sample is None or not request.keys:
            return [], [], None, ([], "")
        block_bytes = sample.numel() * sample.element_size()
        buffer = self._buffers.take(len(request.keys) * block_bytes)
        rows = buffer.view(sample.dtype).view(len(request.keys), *sample.shape)
        tokens = self.tier.read_many_into(list(request.keys), rows)
        if not tokens:
            self._buffers.sent(buffer, None)
            return [], [], None, ([], "")
        keys = list(request.keys[: len(tokens)])
        return keys, [list(t) for t in tokens], buffer[: len(keys) * block_bytes], _block_meta(sample)

    def _gather_into(
        self, writer: NixlWriter, request: FetchRequest, room: int
    ) -> tuple[list[tuple[int, int]], list[list[int]], torch.Tensor | None, int]:
        """The first ``room`` blocks asked for (a gapless prefix) copied back to back into the writer's
        staging buffer; (keys, token ids, the first block as a shape/dtype sample, bytes staged)."""
        sample = self.tier.peek_layout()
        if sample is None or not room:
            return [], [], None, 0
        block_bytes = sample.numel() * sample.element_size()
        rows = writer.stage(room * block_bytes).view(sample.dtype).view(room, *sample.shape)
        tokens = self.tier.read_many_into(list(request.keys[:room]), rows)
        keys = list(request.keys[: len(tokens)])
        return keys, [list(t) for t in tokens], sample, len(keys) * block_bytes

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
