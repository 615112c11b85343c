"""Links: typed messages between two actors, logged by the link, with the cause as parent."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
from bus_helpers import recv_all

from bus.addresses import BusAddresses
from bus.link import Link
from bus.messages import Abort, Consume, TokenBatch, TrainBatch
from bus.publisher import Publisher
from bus.schema import Channel
from bus.stamp import Cause
from bus.subscriber import Subscriber


def _recv(link: Link, timeout_s: float = 10.0) -> tuple[str, list]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if link.socket.poll(100):
            received = link.recv()
            if received is not None:
                return received
    raise TimeoutError("nothing arrived on the link")


@pytest.fixture
def pair(ctx: zmq.Context, tmp_path):  # type: ignore[no-untyped-def]
    """make(**server_options) -> (router's serving link, the coordinator's link to it); closed after the test."""
    made: list[Link] = []

    def make(**server_options) -> tuple[Link, Link]:  # type: ignore[no-untyped-def]
        address = f"ipc://{tmp_path}/router.sock"
        server = Link(ctx, address, sender="router", serve=True, **server_options)
        client = Link(ctx, address, sender="coordinator-router", serve=False, identity="coordinator")
        made.extend([server, client])
        return server, client

    yield make
    for link in made:
        link.close()


def test_messages_travel_both_ways_and_the_server_answers_by_name(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair()
    client.send(Consume(buffer=3, trainer_version=3))
    peer, [event] = _recv(server)
    assert peer == "coordinator" and event.message == Consume(buffer=3, trainer_version=3)
    assert event.envelope.sender == "coordinator-router.link" and event.envelope.seq == 1
    assert server.send(Abort(request_ids=[7], reason="surplus"), "coordinator", request_id=7) is not None
    _, [answer] = _recv(client)
    assert answer.message.request_ids == [7] and answer.envelope.request_id == 7


def test_a_send_to_a_peer_that_is_gone_returns_none(pair) -> None:  # type: ignore[no-untyped-def]
    server, _ = pair()
    assert server.send(Abort(request_ids=[1]), "nobody") is None
    assert server.num_unroutable == 1
    assert server.logged.seq == 0  # a failed send takes no number: the logged stream has no hole


def test_an_undecodable_message_is_counted_and_dropped(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair()
    client.socket.send_multipart([b"ledger.consume", b"\xc1 not msgpack"])
    client.send(Consume(buffer=1, trainer_version=1))
    _, events = _recv(server)
    assert events == [] and server.drops.total == 1
    _, [event] = _recv(server)
    assert event.message.buffer == 1


def test_the_link_logs_what_it_sends_with_its_envelope_and_the_cause_as_parent(
    ctx: zmq.Context, proxy: BusAddresses, pair
) -> None:  # type: ignore[no-untyped-def]
    publisher = Publisher(ctx, proxy, "router")
    cause = Cause()
    server, client = pair(log=publisher, cause=cause)
    log = Subscriber(ctx, proxy.events_out)
    assert publisher.wait_subscribed(10, (Channel.EVENTS,))
    client.send(Consume(buffer=0, trainer_version=0))  # the coordinator's link has no publisher here
    _recv(server)
    cause.event_id = "coordinator-router.link#0:1"
    chunk = TokenBatch(
        request_ids=np.asarray([5], np.int64),
        counts=np.asarray([3], np.int32),
        token_ids=np.arange(3, dtype=np.int32),
        logprobs=np.zeros(3, np.float32),
        versions=np.zeros(3, np.int32),
        instance="rollout-0",
    )
    sent_abort = server.send(Abort(request_ids=[5]), "coordinator")
    server.send(chunk, "coordinator")  # streamed tokens are not logged: the result carries every token
    cause.event_id = None
    sent_batch = server.send(
        TrainBatch(step=1, buffer=0, prompt_ids=[], num_trajectories=0, num_tokens=0, min_version=0), "coordinator"
    )
    logged = recv_all(log, 2)
    assert [e.envelope for e in logged] == [sent_abort, sent_batch]  # the very envelopes sent, in order
    assert [e.envelope.seq for e in logged] == [1, 2] and logged[0].envelope.sender == "router.link"
    assert logged[0].envelope.parent == "coordinator-router.link#0:1" and logged[1].envelope.parent is None
    assert log.recv(300) is None
    _, [abort] = _recv(client)
    assert abort.message.request_ids == [5] and abort.envelope == sent_abort
    _, chunks = _recv(client)
    assert chunks[0].envelope.sender == "router.stream" and chunks[0].envelope.parent == "coordinator-router.link#0:1"
    publisher.close()
    log.close()


def test_a_serving_link_must_name_its_peer(pair) -> None:  # type: ignore[no-untyped-def]
    server, _ = pair()
    with pytest.raises(ValueError, match="name the peer"):
        server.send(Abort(request_ids=[1]))
