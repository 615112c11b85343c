"""The one process shape every actor has.

    run():  hello -> setup -> ready -> loop -> teardown      (a fatal error publishes ActorDead)
    loop:   1. drain inputs (block only when idle)
            2. step (the actor's own work; returns whether it is busy)
            3. timers (status snapshots, periodic decisions)

Inputs are sockets registered with a poller: the events subscriber, the control subscriber and
any socket the actor adds (`add_input`). Messages are dispatched through a handler table built
once from the actor's input table (`inputs()`: kind -> handler, by link or bus); an unknown kind
is counted and logged, a handler exception is logged and counted, and the loop goes on. Pause / Resume /
Drain / Shutdown arrive on the control channel and are handled here for every actor. SIGTERM
and end-of-file on stdin (the launcher is gone) become a graceful stop, never an exit from
inside a signal handler. A heartbeat thread publishes liveness even while `step` blocks (a
trainer step can take seconds). Every socket and thread is released by one finalizer.
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import socket as pysocket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml
import zmq

from actors.boot import Boot
from bus import Publisher, Subscriber
from bus.drops import is_sparse_log_point
from bus.link import Link
from bus.messages import (
    ActorDead,
    ActorDrops,
    ActorState,
    ActorStatus,
    Drain,
    Heartbeat,
    Hello,
    Pause,
    PullRetrying,
    Ready,
    Resume,
    Shutdown,
)
from bus.schema import PROTOCOL_VERSION, Channel, Event, Message
from bus.security import start_authenticator
from bus.stamp import Cause
from psrl.config import Config
from psrl.config.bus_settings import bus_settings
from psrl.log import get_logger

DRAIN_BUDGET_S = 0.05  # longest a loop iteration handles inputs before it works and runs timers
DROPS_REPORT_S = 1.0  # how often dropped-message counts are published (when they changed)
IDLE_POLL_MS = 50  # how long an idle loop blocks on its inputs; bounds reaction to signals
SUBSCRIBE_WAIT_S = 10.0  # wait for the logger to subscribe before the first event
STDIN_GRACE_S = 5.0  # after the launcher vanished, exit even if the graceful stop hangs

Handler = Callable[[Event[Any]], None]


@dataclass(frozen=True)
class Inputs:
    """An actor's input table: every kind it handles, where it arrives, and its handler.

    ``link``: kinds that arrive on the actor's own point-to-point links (it does not subscribe to
    them on the bus, where copies of other actors' link traffic are published). ``bus``: kinds it
    subscribes to. ``fatal``: kinds whose handler failing ends the actor (ActorDead, exit 1) instead
    of being counted and logged, for handlers whose failure leaves the actor unable to make
    progress (a failed training step or weight push): the supervisor's restart policy then applies,
    where carrying on would leave the run waiting forever.
    """

    link: Mapping[type[Message], Handler] = field(default_factory=dict)
    bus: Mapping[type[Message], Handler] = field(default_factory=dict)
    fatal: frozenset[type[Message]] = frozenset()


@dataclass
class _Timer:
    interval_s: float
    callback: Callable[[], None]
    next_at: float


class Actor:
    """Base class of every actor. Subclasses set ROLE and override setup / step / teardown."""

    ROLE: ClassVar[str] = ""
    # whether setup binds a request socket at the actor's own endpoint (announced in Hello)
    SERVES_REQUESTS: ClassVar[bool] = False
    # modules a warm spare imports ahead of need (actors.spare), beyond the actor's own module: what
    # the actor's setup imports lazily (a tokenizer, a kernel), and the heavy ones (torch), so a
    # replacement that becomes the spare pays only its own setup
    WARM_IMPORTS: ClassVar[tuple[str, ...]] = ("numpy", "zmq", "msgspec", "yaml", "pydantic")

    def __init__(self, boot: Boot) -> None:
        self.boot = boot
        self.name = boot.name
        self.config = Config.model_validate(yaml.safe_load(boot.config_yaml))
        self.log = get_logger(f"actors.{self.ROLE}", actor=self.name, incarnation=boot.incarnation)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        curve = boot.curve_keys()
        self.bus = bus_settings(self.config, curve)
        self._authenticator = start_authenticator(self.ctx, curve) if curve is not None else None
        self.addresses = boot.addresses()
        self.cause = Cause()  # the event being handled: the parent of whatever goes out meanwhile
        self.publisher = Publisher(
            self.ctx,
            self.addresses,
            self.name,
            boot.incarnation,
            options=self.bus.options,
            array_frame_bytes=self.bus.array_frame_bytes,
            cause=self.cause,
        )
        self.state = ActorState.STARTING
        self.is_paused = False
        self.is_draining = False
        self.stop_reason: str | None = None
        self.num_unhandled = 0
        self.num_handler_errors = 0
        self._reported_drops: dict[str, int] = {}
        self._handlers = self._handler_table()
        self._inputs: dict[Any, Callable[[], None]] = {}
        self._control_inputs: set[Any] = set()
        self._poller = zmq.Poller()
        self._timers: list[_Timer] = []
        self._subscribers = self._subscribe()
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._notices: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._finalizer = weakref.finalize(self, _release, self.ctx, self._heartbeat_stop, self._authenticator)

    # ------------------------------------------------------------------ overridable parts

    def inputs(self) -> Inputs:
        """What the actor handles (control kinds are added by the base)."""
        return Inputs()

    def setup(self) -> dict[str, int]:
        """Build the actor's state; return its capacity for the Ready event."""
        return {}

    def step(self) -> bool:
        """Do one unit of work; return True when more work is waiting (do not block)."""
        return False

    def teardown(self) -> None:
        """Release the actor's own resources (sockets are closed by the base)."""

    @property
    def num_inflight(self) -> int:
        """Work items the actor holds; a draining actor stops when this reaches zero."""
        return 0

    def on_pause(self) -> None:
        """Called when paused (after is_paused is set)."""

    def on_resume(self) -> None:
        """Called when resumed."""

    def drop_counts(self) -> dict[str, int]:
        """Messages dropped so far by ``<input>:<reason>`` (subclasses add the inputs they own)."""
        counts = {
            f"{sub.drops.receiver}:{reason}": n
            for sub in self._subscribers
            for reason, n in sub.drops.as_dict().items()
        }
        counts[f"{self.name}:unhandled"] = self.num_unhandled
        counts[f"{self.name}:handler_error"] = self.num_handler_errors
        return {key: n for key, n in counts.items() if n}

    # ------------------------------------------------------------------ wiring helpers

    def add_input(self, sock: Any, on_readable: Callable[[], None], *, is_control: bool = False) -> None:
        """Poll ``sock`` in the loop and call ``on_readable`` when it has data (control inputs first)."""
        self._inputs[sock] = on_readable
        if is_control:
            self._control_inputs.add(sock)
        self._poller.register(sock, zmq.POLLIN)

    def remove_input(self, sock: Any) -> None:
        """Stop polling ``sock`` (e.g. the pipe of a worker process that was replaced)."""
        if self._inputs.pop(sock, None) is not None:
            self._control_inputs.discard(sock)
            self._poller.unregister(sock)

    def add_link_kinds(self, kinds: Iterable[type[Message]], handler: Handler) -> None:
        """Handle ``kinds`` arriving on the actor's links (for inputs known only once setup built them)."""
        for kind in kinds:
            self._handlers[kind.KIND] = handler
            self._link_kinds.add(kind.KIND)

    def every(self, interval_s: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` from the loop about every ``interval_s`` seconds."""
        self._timers.append(_Timer(interval_s, callback, time.monotonic() + interval_s))

    def dispatch(self, event: Event[Any]) -> None:
        handler = self._handlers.get(event.envelope.kind)
        if handler is None:
            self.num_unhandled += 1
            if is_sparse_log_point(self.num_unhandled):
                self.log.warning(
                    "unhandled message kind", kind=event.envelope.kind, sender=event.envelope.sender,
                    count=self.num_unhandled,
                )  # fmt: skip
            return
        self.cause.event_id = event.envelope.event_id
        try:
            handler(event)
        except Exception as exc:
            if event.envelope.kind in self._fatal_kinds:
                raise
            self.num_handler_errors += 1
            if is_sparse_log_point(self.num_handler_errors):  # a flood of bad requests must not flood the log
                self.log.error(
                    "handler failed", kind=event.envelope.kind, error=repr(exc), count=self.num_handler_errors,
                    tb=traceback.format_exc(),
                )  # fmt: skip
        finally:
            self.cause.event_id = None

    def make_link(self, peer: str, *, serve: bool) -> Link:
        """A link at ``peer``'s endpoint: served here (``serve``, peer = this actor), or to that peer.

        Its sends are logged through this actor's publisher and name the event being handled as
        their parent.
        """
        name = self.name if serve else f"{self.name}-{peer}"
        return Link(
            self.ctx,
            self.boot.endpoint(peer),
            sender=name,
            incarnation=self.boot.incarnation,
            serve=serve,
            identity=None if serve else self.name,
            options=self.bus.options,
            log=self.publisher,
            cause=self.cause,
            array_frame_bytes=self.bus.array_frame_bytes,
            max_message_bytes=self.bus.max_message_bytes,
        )

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    def notify(self, message: Message) -> None:
        """Publish ``message`` from any thread, within a heartbeat, even while the actor's loop is blocked
        (a pull that retries for minutes says so as it happens)."""
        self._notices.put(message)

    def report_pull_retry(self, version: int, attempt: int, max_attempts: int, reason: str) -> None:
        """A weight pull's failed attempt, for the console and the stall watch (``Puller.on_retry``)."""
        self.notify(PullRetrying(self.name, version, attempt, max_attempts, reason))

    def set_state(self, state: ActorState, detail: str = "") -> None:
        if state != self.state:
            self.state = state
            self.publisher.publish(ActorStatus(state, detail))

    def is_addressed(self, targets: list[str]) -> bool:
        return not targets or self.name in targets or self.ROLE in targets

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Run the actor to completion; returns the process exit code."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop("SIGTERM"))
        signal.signal(signal.SIGINT, lambda *_: self.request_stop("SIGINT"))
        try:
            self.publisher.wait_subscribed(SUBSCRIBE_WAIT_S, prefix="")
            self.publisher.publish(
                Hello(
                    role=self.ROLE,
                    host=pysocket.gethostname(),
                    pid=os.getpid(),
                    protocol_major=PROTOCOL_VERSION[0],
                    protocol_minor=PROTOCOL_VERSION[1],
                    request_address=self.boot.endpoints.get(self.name, "") if self.SERVES_REQUESTS else "",
                )
            )
            self._start_heartbeat()
            self.every(DROPS_REPORT_S, self._report_drops)
            capacity = self.setup()
            self.publisher.publish(Ready(capacity))
            self.set_state(ActorState.READY)
            self._loop()
            return 0
        except Exception as exc:
            self._report_fatal(exc)
            return 1
        finally:
            self._close()

    def _loop(self) -> None:
        is_busy = False
        while self.stop_reason is None:
            # 1. inputs: block only when idle
            self._drain_inputs(0 if is_busy else IDLE_POLL_MS)
            # 2. work
            is_busy = False if self.is_paused else self.step()
            # 3. timers
            self._run_timers()
            if self.is_draining and self.num_inflight == 0:
                self.request_stop("drained")
        self.log.info("stopping", reason=self.stop_reason)

    def _drain_inputs(self, timeout_ms: int) -> None:
        """Handle what the inputs hold, for at most ``DRAIN_BUDGET_S`` once something came: inputs that
        never run dry (a flood, or work handed over faster than it is done) must leave the loop's work
        and timers (drop reports, checkpoints) their turn."""
        ready = dict(self._poller.poll(timeout_ms))
        deadline = time.monotonic() + DRAIN_BUDGET_S
        while ready:
            for sock in sorted(ready, key=lambda s: s not in self._control_inputs):
                self._inputs[sock]()
            if self.stop_reason is not None or time.monotonic() > deadline:
                return
            ready = dict(self._poller.poll(0))

    def _run_timers(self) -> None:
        now = time.monotonic()
        for timer in self._timers:
            if now >= timer.next_at:
                timer.next_at = now + timer.interval_s
                timer.callback()

    def _report_drops(self) -> None:
        counts = self.drop_counts()
        if counts != self._reported_drops:
            self._reported_drops = counts
            self.publisher.publish(ActorDrops(counts))

    def _report_fatal(self, exc: BaseException) -> None:
        self.log.error("fatal error", error=repr(exc), tb=traceback.format_exc())
        try:
            self.state = ActorState.DEAD
            self.publisher.publish(ActorDead(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except Exception as publish_error:  # the bus itself may be what failed
            print(f"{self.name}: could not publish ActorDead: {publish_error!r}", file=sys.stderr)

    def _close(self) -> None:
        self._heartbeat_stop.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=2.0)
        try:
            self.teardown()
        finally:
            if self.state != ActorState.DEAD:
                self.state = ActorState.DEAD
                self._report_drops()  # the final counts
                self.publisher.publish(ActorStatus(ActorState.DEAD, self.stop_reason or ""))
            for subscriber in self._subscribers:
                subscriber.close()
            self.publisher.close()
            self._finalizer()

    # ------------------------------------------------------------------ built-in control

    def _on_pause(self, event: Event[Pause]) -> None:
        if self.is_addressed(event.message.targets) and not self.is_paused:
            self.is_paused = True
            self.on_pause()

    def _on_resume(self, event: Event[Resume]) -> None:
        if self.is_addressed(event.message.targets) and self.is_paused:
            self.is_paused = False
            self.on_resume()

    def _on_drain(self, event: Event[Drain]) -> None:
        if self.is_addressed(event.message.targets):
            self.is_draining = True
            self.set_state(ActorState.DRAINING)

    def _on_shutdown(self, event: Event[Shutdown]) -> None:
        if self.is_addressed(event.message.targets):
            self.request_stop(f"shutdown: {event.message.reason}" if event.message.reason else "shutdown")

    # ------------------------------------------------------------------ internals

    def _handler_table(self) -> dict[str, Handler]:
        inputs = self.inputs()
        control: dict[type[Message], Handler] = {
            Pause: self._on_pause,
            Resume: self._on_resume,
            Drain: self._on_drain,
            Shutdown: self._on_shutdown,
        }
        table = {kind.KIND: handler for kind, handler in {**control, **inputs.bus, **inputs.link}.items()}
        self._link_kinds = {kind.KIND for kind in inputs.link}
        self._fatal_kinds = {kind.KIND for kind in inputs.fatal}
        return table

    def _subscribe(self) -> list[Subscriber]:
        from bus.schema import CATALOGUE

        by_channel: dict[Channel, list[str]] = {Channel.EVENTS: [], Channel.CONTROL: []}
        for kind in self._handlers:
            if kind not in self._link_kinds:
                by_channel[CATALOGUE[kind].CHANNEL].append(kind)
        subscribers = []
        for channel, address in (
            (Channel.EVENTS, self.addresses.events_out),
            (Channel.CONTROL, self.addresses.control_out),
        ):
            kinds = by_channel[channel]
            if not kinds:
                continue
            sub = Subscriber(
                self.ctx,
                address,
                kinds,
                options=self.bus.options,
                max_message_bytes=self.bus.max_message_bytes,
                name=f"{self.name}:{channel.name.lower()}",
            )
            self.add_input(
                sub.socket, functools.partial(self._on_subscriber, sub), is_control=channel == Channel.CONTROL
            )
            subscribers.append(sub)
        return subscribers

    def _on_subscriber(self, subscriber: Subscriber) -> None:
        for event in subscriber.recv_batch(0):
            self.dispatch(event)

    def _start_heartbeat(self) -> None:
        interval_s = self.config.bus.heartbeat_interval_ms / 1000
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, args=(interval_s,), name="heartbeat", daemon=True
        )
        self._heartbeat_thread.start()
        if self.boot.exit_on_stdin_eof:
            threading.Thread(target=self._watch_stdin, name="stdin-watch", daemon=True).start()

    def _heartbeat_loop(self, interval_s: float) -> None:
        beats = Publisher(self.ctx, self.addresses, f"{self.name}/hb", self.boot.incarnation, options=self.bus.options)
        try:
            while not self._heartbeat_stop.wait(interval_s):
                beats.publish(Heartbeat(self.state, self._safe_inflight()))
                while not self._notices.empty():
                    beats.publish(self._notices.get_nowait())
        finally:
            beats.close()

    def _safe_inflight(self) -> int:
        """The in-flight count for a heartbeat; never fails (setup may still be building state)."""
        try:
            return int(self.num_inflight)
        except Exception:
            return 0

    def _watch_stdin(self) -> None:
        """End-of-file on stdin means the launcher is gone: stop, and exit if stopping hangs."""
        try:
            while sys.stdin.readline():
                pass
        except (OSError, ValueError):
            return
        self.request_stop("launcher gone (stdin closed)")
        if not self._heartbeat_stop.wait(STDIN_GRACE_S):
            os._exit(3)


def _release(ctx: zmq.Context[zmq.Socket[bytes]], heartbeat_stop: threading.Event, authenticator: Any) -> None:
    heartbeat_stop.set()
    if authenticator is not None:
        authenticator.stop()
    ctx.destroy(linger=2000)
