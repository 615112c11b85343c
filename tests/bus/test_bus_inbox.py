"""Control is never handled behind data: the inbox drains the control subscription first."""

from __future__ import annotations

import time

import zmq
from bus_helpers import wait_connected

from bus.addresses import BusAddresses
from bus.inbox import Inbox
from bus.messages import Metrics, Pause
from bus.publisher import Publisher
from bus.subscriber import Subscriber


def test_pause_overtakes_thousands_of_queued_data_events(ctx: zmq.Context, proxy: BusAddresses) -> None:
    control = Subscriber(ctx, proxy.control_out, ["ctl."])
    data = Subscriber(ctx, proxy.events_out)
    inbox = Inbox([control, data])
    publisher = Publisher(ctx, proxy, "coordinator")
    wait_connected(publisher)
    publisher.publish_many([Metrics(step, {}) for step in range(5000)])
    publisher.publish(Pause(reason="sync"))  # sent after every data event
    deadline = time.monotonic() + 20
    while not (control.socket.poll(0) and data.socket.poll(0)):
        assert time.monotonic() < deadline, "events did not arrive"
        time.sleep(0.005)
    first = inbox.next(1000)
    assert first is not None and first.kind == "ctl.pause"
    rest = [inbox.next(1000) for _ in range(5000)]
    assert [e.message.step for e in rest if e is not None] == list(range(5000))
    assert inbox.next(50) is None
    for closable in (publisher, control, data):
        closable.close()
