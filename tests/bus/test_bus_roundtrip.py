"""Every message kind survives encode -> real ZeroMQ socket -> decode, over inproc and tcp."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import assert_same, envelopes, structs

from bus.codec import Decoder, Encoder
from bus.io import recv_event_frames, send_frames
from bus.messages import FinishReason, GenerateResult, Metrics
from bus.schema import CATALOGUE, Envelope, Message
from bus.sockets import SocketOptions, bound_address, make_socket

ARRAY_FRAME_BYTES = 256  # small, so generated arrays take both the inline and the frame path


class Link:
    """A connected PUSH -> PULL pair plus codec: what the bus does with one message."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        options = SocketOptions(hwm=0)
        self.rx = make_socket(ctx, zmq.PULL, address, options=options, bind=True)
        self.tx = make_socket(ctx, zmq.PUSH, bound_address(self.rx), options=options, bind=False)
        self.encoder = Encoder(ARRAY_FRAME_BYTES)
        self.decoder = Decoder()

    def roundtrip(self, envelope: Envelope, message: Message) -> tuple[object, int]:
        frames = self.encoder.encode(envelope, message)
        send_frames(self.tx, frames)
        if not self.rx.poll(10_000):
            raise TimeoutError("message did not arrive")
        received = recv_event_frames(self.rx)
        return self.decoder.decode_one(received), len(received)

    def close(self) -> None:
        self.tx.close(0)
        self.rx.close(0)


@pytest.fixture(scope="module", params=["inproc", "tcp"])
def link(request: pytest.FixtureRequest) -> Iterator[Link]:
    ctx = zmq.Context()
    address = "inproc://roundtrip" if request.param == "inproc" else "tcp://127.0.0.1:*"
    pair = Link(ctx, address)
    yield pair
    pair.close()
    ctx.term()


@pytest.mark.parametrize("kind", list(CATALOGUE))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_kind_roundtrips(link: Link, kind: str, data: st.DataObject) -> None:
    cls = CATALOGUE[kind]
    envelope = data.draw(envelopes(cls), label="envelope")
    message = data.draw(structs(cls), label="message")
    event, _ = link.roundtrip(envelope, message)
    assert event.envelope == envelope
    assert_same(message, event.message)


def test_large_arrays_travel_as_trailing_frames(link: Link) -> None:
    tokens = np.arange(10_000, dtype=np.int32)
    message = GenerateResult(
        request_id=7,
        prompt_id=0,
        token_ids=tokens,
        logprobs=np.zeros(3, np.float32),
        versions=np.full(10_000, 4, np.int32),
        finish_reason=FinishReason.LENGTH,
        instance="rollout-0",
    )
    event, num_frames = link.roundtrip(Envelope("gen.result", 1, "rollout-0", 0, 1, 2, 3), message)
    assert num_frames == 4  # kind, body, token_ids, versions; the small logprobs stay inline
    assert_same(message, event.message)


def test_torch_tensors_are_sent_as_arrays(link: Link) -> None:
    torch = pytest.importorskip("torch")
    message = GenerateResult(
        1, 2, torch.arange(5, dtype=torch.int32), torch.zeros(5), torch.ones(5, dtype=torch.int32), 0, "i0"
    )
    event, _ = link.roundtrip(Envelope("gen.result", 1, "rollout-0", 0, 1, 2, 3), message)
    assert event.message.token_ids.tolist() == [0, 1, 2, 3, 4]
    assert event.message.logprobs.dtype == np.float32


def test_unsupported_values_are_refused_at_encode() -> None:
    encoder = Encoder()
    bad = Metrics(1, {"x": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        encoder.encode(Envelope("obs.metrics", 1, "a", 0, 1, 2, 3), bad)
    with pytest.raises(TypeError, match="dtype"):
        encoder.encode(
            Envelope("gen.result", 1, "a", 0, 1, 2, 3),
            GenerateResult(1, 0, np.array(["a"], dtype=object), np.zeros(1), np.zeros(1), FinishReason.STOP, "i"),
        )
