"""A subscriber that stops reading loses events (and counts them); nobody else is held up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import zmq
from bus_helpers import wait_connected

from bus.addresses import plan_addresses
from bus.gaps import GapTracker, SenderSeq
from bus.messages import Heartbeat, Metrics
from bus.proxy import BusProxy
from bus.publisher import Publisher
from bus.schema import Event
from bus.sockets import SocketOptions
from bus.subscriber import Subscriber

NUM_EVENTS = 30_000
BATCH = 500
FINAL_STEP = -1


def test_stalled_subscriber_drops_and_counts_while_others_keep_flowing(ctx: zmq.Context, tmp_path: Path) -> None:
    proxy = BusProxy(plan_addresses(tmp_path, "ipc"), options=SocketOptions(hwm=1000), ctx=ctx)
    addresses = proxy.start()
    stalled = Subscriber(ctx, addresses.events_out, options=SocketOptions(hwm=100), name="stalled")
    fast = Subscriber(ctx, addresses.events_out, options=SocketOptions(hwm=0), name="fast")
    control = Subscriber(ctx, addresses.control_out)  # so the publisher sees both channels subscribed
    publisher = Publisher(ctx, addresses, "trainer")
    wait_connected(publisher)
    _flush_joins(publisher, [stalled, fast])
    start_seq = publisher.stamper.seq

    received: list[Event] = []
    reader = threading.Thread(target=_read_until_final, args=(fast, received))
    reader.start()
    for step in range(NUM_EVENTS):  # the stalled subscriber reads nothing meanwhile
        publisher.publish(Metrics(step, {}))
        if step % BATCH == 0:
            time.sleep(0.001)  # let the reader thread have the GIL now and then
    _publish_final_until(publisher, lambda: not reader.is_alive())
    assert received and received[-1].message.step == FINAL_STEP, "the fast subscriber was held up"
    _assert_accounted(fast, received, start_seq)

    stalled_events = _drain(stalled)
    _publish_final_until(publisher, lambda: _received_final(stalled, stalled_events))
    assert stalled.gaps.num_missing > 0, "a stalled subscriber with a small queue must have lost events"
    _assert_accounted(stalled, stalled_events, start_seq)
    for closable in (publisher, stalled, fast, control):
        closable.close()
    proxy.stop()


def _read_until_final(sub: Subscriber, received: list[Event]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        event = sub.recv(50)
        if event is not None:
            received.append(event)
            if event.message.step == FINAL_STEP:
                return


def _publish_final_until(publisher: Publisher, is_done: object, timeout_s: float = 60.0) -> None:
    """Publish the final marker every 20 ms until `is_done()`: a single one may hit a full queue."""
    deadline = time.monotonic() + timeout_s
    while not is_done():  # type: ignore[operator]
        assert time.monotonic() < deadline, "final marker never arrived"
        publisher.publish(Metrics(FINAL_STEP, {}))
        time.sleep(0.02)


def _received_final(sub: Subscriber, events: list[Event]) -> bool:
    event = sub.recv(0)
    if event is not None:
        events.append(event)
    return bool(events) and events[-1].message.step == FINAL_STEP


def _drain(sub: Subscriber) -> list[Event]:
    """Everything the stalled subscriber has queued, until it has been empty for half a second."""
    events = []
    while (event := sub.recv(500)) is not None:
        events.append(event)
    return events


def _assert_accounted(sub: Subscriber, events: list[Event], start_seq: int) -> None:
    """Every event up to the last one received was either received or counted as missing."""
    published_up_to_last = events[-1].envelope.seq - start_seq
    assert len(events) + sub.gaps.num_missing == published_up_to_last


def _flush_joins(publisher: Publisher, subs: list[Subscriber]) -> None:
    """Send heartbeats until every subscriber gets them, drain, and start gap counting after them."""
    pending = list(subs)
    for _ in range(500):
        publisher.publish(Heartbeat(state=1))
        pending = [s for s in pending if s.recv(10) is None]
        if not pending:
            break
    for sub in subs:
        while sub.recv(50) is not None:
            pass
        sub.gaps = GapTracker()
        sub.gaps.senders[("trainer", 0)] = SenderSeq(next_seq=publisher.stamper.seq + 1)
