"""The target side of KV transfer: fetch blocks from a source's KV server into the local tier.

Each fetch runs on a worker thread and ends with a ``FetchOutcome``: the blocks that landed (put
in the tier, under the source's version tags), or why none did. A source that dies or answers
late costs only the re-prefill the target would have done anyway.

A fetch asks for its blocks in pieces, in prefix order, and each piece goes into the tier as soon
as it lands (all of its blocks under one tier lock): a target that started prefilling at once
(async mode) takes the leading blocks while later ones are still on their way. The first piece
is ``PIECE_BLOCKS`` long and each next one twice the one before, up to ``MAX_PIECE_BLOCKS``: the
leading blocks come early, and a long fetch pays the cost of a piece (a request, a reply, a NIXL
write set up and waited for, the threads woken on both sides) a few times rather than once per
16 blocks. A fetch the target waits for as a whole (sync, pin_sync) has no use for early leading
blocks: all its pieces are ``MAX_PIECE_BLOCKS`` long (13-30% faster than growing ones, measured
at 1k and 4k tokens of 0.5B and 7B KV).
Up to ``PIECES_IN_FLIGHT`` pieces are asked for at once, so the source copies the next piece out
of its tier while this one crosses the wire and lands; pieces still land strictly in order, and a
piece that comes back short ends the fetch (what was asked past it is dropped: only a gapless
prefix is of use).

The connection to a source is kept for later fetches from it (``Connections``): a new one costs a
TCP and ZeroMQ handshake, a round trip as long as a small piece's. Replies carry the number of the
request they answer, so one left over from a fetch that gave up is recognised and dropped. A fetch
that fails (timeout, closing) closes its connection instead of handing it back.

Both channels land in room reserved in the tier when the piece is asked for, which the tier adopts
when the reply comes. NIXL fetches land in place: the tier's buffer is registered once
(psrl.kvcache.transfer.nixl_channel) and the source writes each piece's blocks into the room
reserved for them; allocations whose write may still come (the request was never answered) are
abandoned, never handed out again. ZeroMQ fetches receive the reply's frames straight into the room
(psrl.kvcache.transfer.frames); a tier that cannot reserve it (the rest pinned) takes the frames
through ``put_many``, as much as fits.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from psrl.kvcache.tier import KvTier
from psrl.kvcache.transfer.frames import FramesError, drain, receive_into
from psrl.kvcache.transfer.nixl_channel import NixlLanding
from psrl.kvcache.transfer.wire import ENCODER, REPLY_DECODER, Channel, FetchReply, FetchRequest

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PIECE_BLOCKS = 16
MAX_PIECE_BLOCKS = 128  # the source's store keeps room to lend three pieces this long (LEND_HEADROOM_BLOCKS)
# a tcp piece grows no longer than this: the receiving ZeroMQ thread mallocs a buffer per frame,
# and above glibc's largest mmap threshold (32 MiB) every one is a fresh mapping, faulted in and
# zeroed page by page while the bytes arrive
MAX_TCP_PIECE_BYTES = 16 << 20
PIECES_IN_FLIGHT = 2
IDLE_CONNECTIONS = 8  # kept across fetches, the least recently used source's first to go
ANSWER_POLL_MS = 50


_CONTEXT: list[zmq.Context[Any]] = []
_CONTEXT_LOCK = threading.Lock()


def fetch_context() -> zmq.Context[Any]:
    """The process's ZeroMQ context for KV fetches, apart from ``Context.instance()``: its own I/O
    thread, so KV bytes queue neither behind nor ahead of the bus's messages, and a source served
    from the same process sends on another thread. Made once, kept for the process's life."""
    with _CONTEXT_LOCK:
        if not _CONTEXT:
            _CONTEXT.append(zmq.Context())
        return _CONTEXT[0]


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


@dataclass(slots=True)
class Asked:
    """A piece asked for and not yet landed."""

    seq: int
    keys: list[tuple[int, int]]
    reservation: Any = None  # NIXL: the tier's allocations the source writes into


class Connections:
    """Idle DEALER sockets by source address; a fetch takes one and hands it back when done with it."""

    def __init__(self, context: zmq.Context[Any], keep: int = IDLE_CONNECTIONS) -> None:
        self._context = context
        self.keep = keep
        self._idle: OrderedDict[str, list[zmq.Socket[Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False
        self.num_opened = 0

    def take(self, address: str) -> zmq.Socket[Any]:
        with self._lock:
            idle = self._idle.get(address)
            if idle:
                return idle.pop()
            self.num_opened += 1
        sock: zmq.Socket[Any] = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        return sock

    def give_back(self, address: str, sock: zmq.Socket[Any], reusable: bool) -> None:
        with self._lock:
            if reusable and not self._closed:
                self._idle.setdefault(address, []).append(sock)
                self._idle.move_to_end(address)
                sock = self._trim()
        if sock is not None:
            sock.close(0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, OrderedDict()
        for socks in idle.values():
            for sock in socks:
                sock.close(0)

    def _trim(self) -> Any:
        """The oldest idle socket once more than ``keep`` are idle (None otherwise)."""
        if sum(len(socks) for socks in self._idle.values()) <= self.keep:
            return None
        address, socks = next(iter(self._idle.items()))
        sock = socks.pop(0)
        if not socks:
            del self._idle[address]
        return sock


class KvFetcher:
    def __init__(
        self,
        tier: KvTier,
        channel: Channel = "tcp",
        max_workers: int = 2,
        piece_blocks: int = PIECE_BLOCKS,
        pieces_in_flight: int = PIECES_IN_FLIGHT,
        max_piece_blocks: int = MAX_PIECE_BLOCKS,
    ) -> None:
        if pieces_in_flight < 1:
            raise ValueError(f"pieces_in_flight={pieces_in_flight}: at least 1 piece must be in flight")
        self.tier = tier
        self.channel = channel
        self.piece_blocks = piece_blocks
        self.max_piece_blocks = max(piece_blocks, max_piece_blocks)
        self.pieces_in_flight = pieces_in_flight
        self.max_workers = max_workers
        self._context = fetch_context()
        self.connections = Connections(self._context)
        self._seq = itertools.count(1)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kv-fetch")
        self._landing: NixlLanding | None = None
        self._landing_lock = threading.Lock()  # guards its creation only
        self._closed = threading.Event()
        self.num_stale_replies = 0
        self.num_abandoned_blocks = 0

    def start(
        self,
        transfer_id: str,
        address: str,
        keys: list[tuple[int, int]],
        timeout_s: float,
        release_pin: str = "",
        awaited: bool = False,
    ) -> Future[FetchOutcome]:
        return self._pool.submit(self.fetch, transfer_id, address, keys, timeout_s, release_pin, awaited)

    def fetch(
        self,
        transfer_id: str,
        address: str,
        keys: list[tuple[int, int]],
        timeout_s: float,
        release_pin: str = "",
        awaited: bool = False,
    ) -> FetchOutcome:
        """Fetch ``keys`` piece by piece until one comes back short; ``timeout_s`` bounds the whole fetch.
        ``awaited``: nothing uses a block before the whole fetch has ended (sync, pin_sync), so every
        piece is as long as allowed; otherwise the first is short, for a prefill taking blocks as they land."""
        started = time.monotonic()
        deadline = started + timeout_s
        pieces = self.plan(keys, awaited)
        landed, num_bytes, error = 0, 0, ""
        asked: deque[Asked] = deque()
        sock = self.connections.take(address)
        try:
            self._ask_ahead(sock, transfer_id, pieces, 0, asked, deadline, release_pin)
            for index in range(len(pieces)):
                piece = asked[0]
                answer = self._receive(sock, address, piece, deadline)
                asked.popleft()
                try:  # the source serves the pieces after this one while it lands
                    self._ask_ahead(sock, transfer_id, pieces, index + 1, asked, deadline, release_pin)
                    count, size = self._land(sock, answer, piece)
                finally:
                    self._end_reservation(piece, answered=True)
                landed, num_bytes = landed + count, num_bytes + size
                if count < len(piece.keys):
                    break
            self._settle(sock, address, asked, deadline)  # asked past a short piece: dropped once answered
        except FetchFailedError as failed:
            error = failed.reason
        finally:
            for piece in asked:  # never answered: a NIXL source may still write into its allocations
                self._end_reservation(piece, answered=False)
            self.connections.give_back(address, sock, reusable=not error)
        return FetchOutcome(transfer_id, landed, num_bytes, time.monotonic() - started, error)

    def close(self) -> None:
        """Stop: queued fetches are cancelled, running ones end at their next wait; nothing waits."""
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.connections.close()

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

    def plan(self, keys: list[tuple[int, int]], awaited: bool = False) -> list[list[tuple[int, int]]]:
        """The pieces a fetch of ``keys`` asks for, in order (see ``fetch``)."""
        largest = self._largest_piece()
        return growing_pieces(keys, largest if awaited else self.piece_blocks, largest)

    def _largest_piece(self) -> int:
        """``max_piece_blocks``, or less where the tier could not hold as many pieces as a fetch
        has open at once (those in flight and the one landing: each has room reserved) or, over
        ZeroMQ, past ``MAX_TCP_PIECE_BYTES``; never less than ``piece_blocks``."""
        layout = self.tier.peek_layout()
        if layout is None:
            return self.piece_blocks
        block_bytes = layout.numel() * layout.element_size()
        open_pieces = self.pieces_in_flight + 1
        largest = min(self.max_piece_blocks, self.tier.index.capacity_bytes // block_bytes // open_pieces)
        if self.channel == "tcp":
            largest = min(largest, MAX_TCP_PIECE_BYTES // block_bytes)
        return max(self.piece_blocks, largest)

    def _ask_ahead(
        self,
        sock: zmq.Socket[Any],
        transfer_id: str,
        pieces: list[list[tuple[int, int]]],
        first: int,
        asked: deque[Asked],
        deadline: float,
        release_pin: str,
    ) -> None:
        """Ask for the pieces from ``first`` on that are not asked for yet, up to ``pieces_in_flight``."""
        while len(asked) < self.pieces_in_flight and first + len(asked) < len(pieces):
            asked.append(self._ask(sock, transfer_id, pieces[first + len(asked)], deadline, release_pin))

    def _ask(
        self, sock: zmq.Socket[Any], transfer_id: str, keys: list[tuple[int, int]], deadline: float, release_pin: str
    ) -> Asked:
        if self._closed.is_set():
            raise FetchFailedError("the fetcher is closing")
        seq = next(self._seq)
        piece = Asked(seq, keys)
        try:
            if self.channel == "nixl":
                landing = self._landing_pool()
                piece.reservation = self.tier.reserve(len(keys)) if keys else None
                regions = piece.reservation.regions if keys else []
                request = FetchRequest(transfer_id, keys, "nixl", release_pin, landing.agent.name, landing.metadata,
                                       regions, seq)  # fmt: skip
            else:
                piece.reservation = self._reserve_for_frames(keys)
                request = FetchRequest(transfer_id, keys, "tcp", release_pin, seq=seq)
            sock.send(ENCODER.encode(request))
        except Exception as exc:  # NIXL's errors subclass Exception only: a fetch ends in an outcome, never raises
            self._end_reservation(piece, answered=True)  # not sent: nothing will be written into it
            raise FetchFailedError(f"{type(exc).__name__}: {exc}") from exc
        return piece

    def _reserve_for_frames(self, keys: list[tuple[int, int]]) -> Any:
        """Room in the tier that a ``tcp`` piece's frames are received straight into (None: no keys, a
        store that cannot reserve, or no room for all of them; its blocks then go through ``put_many``,
        which takes what fits)."""
        if not keys or getattr(self.tier.store, "reserve", None) is None:
            return None
        try:
            return self.tier.reserve(len(keys))
        except MemoryError:
            return None

    def _receive(
        self, sock: zmq.Socket[Any], address: str, piece: Asked, deadline: float
    ) -> tuple[FetchReply, list[Any]]:
        """The reply to ``piece`` (replies to other requests are dropped) and its frames of blocks,
        except where the piece has room reserved: those are left to ``_land`` to read into it."""
        while True:
            self._await_answer(sock, address, deadline)
            head = sock.recv(copy=False)
            try:
                reply = REPLY_DECODER.decode(head.buffer)
            except Exception as exc:
                raise FetchFailedError(f"malformed reply from {address}: {exc}") from exc
            if reply.seq == piece.seq:
                if piece.reservation is not None:
                    return reply, []
                frames = []
                while sock.getsockopt(zmq.RCVMORE):
                    frames.append(sock.recv(copy=False, flags=zmq.NOBLOCK))
                return reply, frames
            drain(sock)
            self.num_stale_replies += 1

    def _land(self, sock: zmq.Socket[Any], answer: tuple[FetchReply, list[Any]], piece: Asked) -> tuple[int, int]:
        """Put the piece's blocks in the tier, a run at a time; (blocks it holds now, their bytes)."""
        reply, frames = answer
        if reply.error:
            raise FetchFailedError(reply.error)
        if not reply.keys:
            return 0, 0
        keys, tokens = [(k[0], k[1]) for k in reply.keys], [tuple(t) for t in reply.token_ids]
        if list(reply.keys) != [tuple(k) for k in piece.keys[: len(reply.keys)]]:
            raise FetchFailedError("the reply names keys that were not asked for")
        if piece.reservation is not None:
            if self.channel == "tcp":
                self._receive_reserved(sock, reply, piece.reservation)
            count = self.tier.land_reserved(keys, tokens, piece.reservation)
            return count, count * piece.reservation.regions[0][1]
        try:
            runs = self._blocks(reply, frames)
        except ValueError as exc:
            raise FetchFailedError(str(exc)) from exc
        landed = 0
        for run in runs:
            count = self.tier.put_many(keys[landed : landed + len(run)], tokens[landed : landed + len(run)], run)
            landed += count
            if count < len(run):
                break
        return landed, landed * runs[0][0].numel() * runs[0].element_size()

    def _receive_reserved(self, sock: zmq.Socket[Any], reply: FetchReply, reservation: Any) -> None:
        """Read a ``tcp`` reply's frames into the room reserved for its blocks (their layout must be the tier's)."""
        layout = self.tier.peek_layout_locked()
        if list(reply.block_shape) != list(layout.shape) or DTYPES.get(reply.dtype) != layout.dtype:
            raise FetchFailedError(f"blocks of {reply.block_shape} {reply.dtype} announced, the tier holds "
                                   f"{list(layout.shape)} {layout.dtype}")  # fmt: skip
        try:
            receive_into(sock, self.tier.store, reservation, len(reply.keys), reservation.regions[0][1])
        except FramesError as exc:
            raise FetchFailedError(str(exc)) from exc

    def _blocks(self, reply: FetchReply, frames: list[Any]) -> list[torch.Tensor]:
        """The reply's blocks as [blocks, *block shape] tensors over its frames (a run of blocks each)."""
        if reply.dtype not in DTYPES:
            raise ValueError(f"a reply of dtype {reply.dtype!r}")
        shape, dtype = torch.Size(reply.block_shape), DTYPES[reply.dtype]
        block_bytes = shape.numel() * dtype.itemsize
        sizes = [len(frame.buffer) for frame in frames]
        if sum(sizes) != len(reply.keys) * block_bytes or any(size % block_bytes for size in sizes):
            raise ValueError(f"{len(reply.keys)} blocks of {tuple(shape)} announced, frames of {sizes} bytes received")
        with warnings.catch_warnings():  # read-only frames: the tier copies out of them before they go
            warnings.simplefilter("ignore", UserWarning)
            return [torch.frombuffer(f.buffer, dtype=dtype).view(-1, *shape) for f in frames]

    def _settle(self, sock: zmq.Socket[Any], address: str, asked: deque[Asked], deadline: float) -> None:
        """NIXL pieces asked past a short one: wait for their replies (their writes are done then) so
        their allocations can go back. ZeroMQ replies are simply dropped when they come."""
        while self.channel == "nixl" and asked and asked[0].reservation is not None:
            piece = asked[0]
            self._receive(sock, address, piece, deadline)
            asked.popleft()
            self._end_reservation(piece, answered=True)

    def _end_reservation(self, piece: Asked, answered: bool) -> None:
        reservation, piece.reservation = piece.reservation, None
        if reservation is None or not reservation.open:
            return
        if answered or self.channel == "tcp":  # only this thread ever writes into a tcp piece's room
            self.tier.release_reserved(reservation)
        else:  # a late write may still land in its allocations: never handed out again, room kept
            reservation.open = False
            self.num_abandoned_blocks += reservation.count

    def _landing_pool(self) -> NixlLanding:
        with self._landing_lock:
            if self._landing is None:  # the tier's buffer, registered once: blocks land in place
                memory = getattr(self.tier.store, "memory", None)
                if memory is None:
                    raise ValueError("a NIXL fetch needs a tier store whose blocks live in one buffer (LmcacheStore)")
                self._landing = NixlLanding([memory])
            return self._landing

    def _await_answer(self, sock: zmq.Socket[Any], address: str, deadline: float) -> None:
        """Wait for the source's answer in short slices, so that ``close`` ends a fetch promptly."""
        while not sock.poll(ANSWER_POLL_MS):
            if self._closed.is_set():
                raise FetchFailedError("the fetcher is closing")
            if time.monotonic() >= deadline:
                raise FetchFailedError(f"TimeoutError: no answer from {address} in time")


def growing_pieces(keys: list[tuple[int, int]], first: int, largest: int) -> list[list[tuple[int, int]]]:
    """``keys`` cut in order into pieces of ``first`` keys, then each twice the one before, up to
    ``largest``; one empty piece for no keys (a fetcher warming its connection still asks)."""
    pieces, start, size = [], 0, first
    while start < len(keys):
        pieces.append(keys[start : start + size])
        start, size = start + size, min(largest, size * 2)
    return pieces or [[]]
