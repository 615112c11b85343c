"""Publisher details: waiting for the logger's subscription, batching runs of kinds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import zmq
from bus_helpers import recv_all

from bus.addresses import BusAddresses, plan_addresses
from bus.errors import BusError
from bus.messages import Metrics, Pause
from bus.proxy import BusProxy
from bus.publisher import Publisher
from bus.schema import Channel
from bus.subscriber import Subscriber


def test_wait_for_a_catch_all_subscription(ctx: zmq.Context, tmp_path: Path) -> None:
    # without a retainer: the proxy itself then subscribes to nothing (see the next test)
    bus_proxy = BusProxy(dataclasses.replace(plan_addresses(tmp_path, "ipc"), catch_up=None), ctx=ctx)
    proxy = bus_proxy.start()
    publisher = Publisher(ctx, proxy, "router")
    narrow = Subscriber(ctx, proxy.events_out, ["gen."])
    assert publisher.wait_subscribed(10, (Channel.EVENTS,))
    assert not publisher.wait_subscribed(0.3, (Channel.EVENTS,), prefix="")  # only "gen." so far
    everything = Subscriber(ctx, proxy.events_out)
    assert publisher.wait_subscribed(10, (Channel.EVENTS,), prefix="")
    for closable in (publisher, narrow, everything):
        closable.close()
    bus_proxy.stop()


def test_a_retaining_proxy_takes_every_kind_even_without_subscribers(ctx: zmq.Context, proxy: BusAddresses) -> None:
    # what nobody subscribes to still reaches the retainer, for a logger that is not there yet
    publisher = Publisher(ctx, proxy, "router")
    assert publisher.wait_subscribed(10, prefix="")
    publisher.close()


def test_publish_many_keeps_order_and_channels(ctx: zmq.Context, proxy: BusAddresses) -> None:
    events = Subscriber(ctx, proxy.events_out)
    control = Subscriber(ctx, proxy.control_out)
    publisher = Publisher(ctx, proxy, "trainer")
    assert publisher.wait_subscribed(10, prefix="")
    batch = [Metrics(1, {}), Metrics(2, {}), Pause(), Metrics(3, {})]
    envelopes = publisher.publish_many(batch, request_ids=[7, None, None, 9], model_version=4)
    # one numbered stream per channel: control events are sender "trainer/ctl"
    assert [(e.sender, e.seq) for e in envelopes] == [
        ("trainer", 1),
        ("trainer", 2),
        ("trainer/ctl", 1),
        ("trainer", 3),
    ]
    received = recv_all(events, 3)
    assert [e.message.step for e in received] == [1, 2, 3]
    assert [e.envelope.request_id for e in received] == [7, None, 9]
    assert {e.envelope.model_version for e in received} == {4}
    (pause,) = recv_all(control, 1)
    assert (pause.envelope.sender, pause.envelope.seq) == ("trainer/ctl", 1)
    with pytest.raises(BusError, match="one entry per message"):
        publisher.publish_many(batch, request_ids=[1])
    for closable in (publisher, events, control):
        closable.close()
