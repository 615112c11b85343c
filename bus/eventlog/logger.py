"""The log writer that subscribes to the run's proxies and appends every event to the log.

It stores each event's frames exactly as received; it decodes only the envelope, to drop
malformed messages (counted) and to count events lost before they reached it (from per-sender
sequence numbers). Control events are taken first, as everywhere on the bus. Buffered records
are flushed to the operating system whenever the bus goes quiet and at least every
`flush_interval_s`, so a reader of a live run sees recent events.

A logger first catches up from the proxy's retainer (`bus.eventlog.catch_up`) when the bus has
one: what was forwarded after the log's last record (for a new log, since the proxy started)
while no logger was writing is appended in forwarding order before the live messages.

A write that fails (a full disk: OSError ENOSPC) ends the writer thread; the failure is kept, and
`check` and `stop` raise it, so the process that owns the logger can die of it rather than live on
beside a log that stopped growing.
"""

from __future__ import annotations

import threading
import time
import traceback
from pathlib import Path
from typing import Any

import msgspec
import structlog
import zmq

from bus.addresses import BusAddresses
from bus.drops import DropCounter
from bus.errors import BusError, DecodeError, DropReason
from bus.eventlog.catch_up import CatchUpResult, LiveDeduper, log_anchor, request_catch_up
from bus.eventlog.writer import DEFAULT_SEGMENT_BYTES, EventLogWriter, FsyncPolicy
from bus.gaps import GapTracker
from bus.io import NOBLOCK, recv_event_frames
from bus.retainer import MessageKey, message_key
from bus.schema import Envelope
from bus.sockets import DEFAULT_SOCKET_OPTIONS, SocketOptions, make_socket

_MAX_BATCH = 1000  # messages taken from one socket before looking at the other again
SUBSCRIBE_WAIT_S = 2.0  # a restarted logger waits this long for live traffic before catching up


class EventLogger:
    """Appends every event of both channels to ``events_dir``. Use `run` in a thread or process."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        addresses: BusAddresses,
        events_dir: str | Path,
        *,
        options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: FsyncPolicy = "segment",
        flush_interval_s: float = 0.2,
    ) -> None:
        # read before the writer opens its segment: a restarted logger continues after this record
        self._catch_up_address = addresses.catch_up
        self._anchor = log_anchor(events_dir) if addresses.catch_up is not None else None
        self._ctx = ctx
        self._options = options
        self._dedupe = LiveDeduper()
        self.catch_up: CatchUpResult | None = None  # what the catch-up delivered, once it ran
        self.writer = EventLogWriter(events_dir, segment_bytes=segment_bytes, fsync=fsync)
        self.drops = DropCounter("event-logger")
        # a restarted logger counts gaps from what it sees first (its catch-up), not from seq 1
        self.gaps = GapTracker(from_first_seen=self._anchor is not None)
        self.flush_interval_s = flush_interval_s
        self._envelopes_only = msgspec.msgpack.Decoder(list[tuple[Envelope, msgspec.Raw]])
        self._sockets = [
            make_socket(ctx, zmq.SUB, addresses.control_out, options=options, subscribe=[b""]),
            make_socket(ctx, zmq.SUB, addresses.events_out, options=options, subscribe=[b""]),
        ]
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.failure: BaseException | None = None  # what ended the writer thread early

    def run(self, stop: threading.Event) -> None:
        """Log until `stop` is set, then take what is already queued, fsync (per policy) and close."""
        poller = zmq.Poller()
        for socket in self._sockets:
            poller.register(socket, zmq.POLLIN)
        last_flush = time.monotonic()
        poll_ms = max(1, int(self.flush_interval_s * 1000))
        try:
            if self._catch_up_address is not None:
                self._catch_up(poller, self._catch_up_address, self._anchor)
            while not stop.is_set():
                ready = dict(poller.poll(poll_ms))
                num_taken = sum(self._drain(s) for s in self._sockets if s in ready)
                now = time.monotonic()
                if num_taken == 0 or now - last_flush >= self.flush_interval_s:
                    self.writer.flush()
                    last_flush = now
            while sum(self._drain(s) for s in self._sockets):
                pass
        except BaseException as exc:
            self.failure = exc  # before the close below, which may fail the same way on a full disk
            raise
        finally:
            self._close(quiet=self.failure is not None)

    def _close(self, *, quiet: bool) -> None:
        try:
            self.writer.close()
        except OSError:
            if not quiet:
                raise
        finally:
            for socket in self._sockets:
                socket.close(0)

    def _drain(self, socket: zmq.Socket[bytes], held: list[list[Any]] | None = None) -> int:
        """Take what ``socket`` has queued (or hold it in ``held``, during a catch-up)."""
        num_taken = 0
        try:  # one failed non-blocking receive ends a burst of up to _MAX_BATCH messages
            while num_taken < _MAX_BATCH:
                frames = recv_event_frames(socket, NOBLOCK)
                if held is not None:
                    held.append(frames)
                elif not self._dedupe.is_duplicate(frames):
                    self.take(frames)
                num_taken += 1
        except zmq.Again:
            pass
        return num_taken

    def _catch_up(self, poller: zmq.Poller, address: str, anchor: MessageKey | None) -> None:
        """Append what the proxy forwarded after ``anchor`` (all it kept, for a new log: events
        sent before this logger subscribed), then the live messages held meanwhile."""
        held: list[list[Any]] = []
        deadline = time.monotonic() + SUBSCRIBE_WAIT_S
        while not held and time.monotonic() < deadline:  # the subscription carries traffic now
            ready = dict(poller.poll(50))
            for socket in self._sockets:
                if socket in ready:
                    self._drain(socket, held)
        self.catch_up = request_catch_up(self._ctx, address, anchor, self._options)
        log = structlog.get_logger("bus.eventlog")
        if self.catch_up is None:
            log.warning("event log catch-up unanswered", address=address)
        else:
            keys = {key for frames in self.catch_up.messages if self.take(frames) and (key := message_key(frames))}
            self._dedupe.remember(keys)
            log.info(
                "event log caught up", messages=len(self.catch_up.messages), anchor_found=self.catch_up.anchor_found
            )
        for frames in held:
            if not self._dedupe.is_duplicate(frames):
                self.take(frames)

    def take(self, frames: list[Any]) -> bool:
        """Append one received message if its envelopes are sound; False (counted) if dropped."""
        try:
            if len(frames) < 2:
                raise DecodeError(DropReason.MALFORMED, f"{len(frames)} frame(s)")
            events = self._envelopes_only.decode(frames[1])
            kind = bytes(frames[0])
            if not events or any(envelope.kind.encode() != kind for envelope, _ in events):
                raise DecodeError(DropReason.MALFORMED, f"topic {kind[:64]!r} does not match the envelopes")
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.drops.record(DecodeError(DropReason.MALFORMED, str(exc)))
            return False
        except DecodeError as error:
            self.drops.record(error)
            return False
        for envelope, _ in events:
            self.gaps.observe(envelope)
        self.writer.append(frames)
        return True

    def start(self) -> None:
        """Run in a background thread (sockets move to it; do not use them from here afterwards)."""
        if self._thread is not None:
            raise BusError("event logger already started")
        self._thread = threading.Thread(target=self._run_in_thread, name="event-logger", daemon=True)
        self._thread.start()

    def _run_in_thread(self) -> None:
        try:
            self.run(self._stop)
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            traceback.print_exc()  # the whole story for the owner's log; `check` and `stop` raise it

    def check(self) -> None:
        """Raise `EventLogFailedError` if the writer thread died (the log stopped growing)."""
        if self.failure is not None:
            raise EventLogFailedError(f"event log writer died: {self.failure!r}") from self.failure
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise EventLogFailedError("event log writer thread ended without being stopped")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise BusError(f"event logger did not stop within {timeout_s} s")
        self._thread = None
        self.check()  # a log that ended early, or whose last records were never written, is a failure


class EventLogFailedError(BusError):
    """The event log's writer failed (a full disk, an I/O error): events after the failure are not logged."""
