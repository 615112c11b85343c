"""100,000 hostile messages at live receivers: nothing crashes, everything is counted."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator

import msgspec
import numpy as np
import zmq

from bus.codec import Encoder
from bus.errors import DropReason
from bus.link import Link
from bus.messages import FinishReason, GenerateResult, Metrics
from bus.schema import Envelope
from bus.sockets import SocketOptions, bound_address, make_socket
from bus.subscriber import Subscriber

MAX_MESSAGE_BYTES = 4096  # small limit so oversized messages are cheap to make
NUM_FUZZ = 100_000

Frames = list[bytes]


def _valid(seq: int) -> Frames:
    envelope = Envelope("obs.metrics", 1, "fuzzer", 0, seq, 1, 2)
    return Encoder().encode(envelope, Metrics(seq, {"loss": 0.5}))  # type: ignore[return-value]


def _with_array() -> Frames:
    result = GenerateResult(
        request_id=1,
        prompt_id=0,
        token_ids=np.arange(64, dtype=np.int32),
        logprobs=np.zeros(64, np.float32),
        versions=np.zeros(64, np.int32),
        finish_reason=FinishReason.STOP,
        instance="i",
    )
    return Encoder(array_frame_bytes=128).encode(Envelope("gen.result", 1, "fuzzer", 0, 1, 1, 2), result)  # type: ignore[return-value]


class Fuzzer:
    """Makes one bad message of each category, fresh random bytes every time."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.good = _valid(1)
        self.array = _with_array()
        self.categories: list[tuple[DropReason, Callable[[], Frames]]] = [
            (DropReason.UNKNOWN_KIND, self.random_frames),
            (DropReason.MALFORMED, self.truncated_body),
            (DropReason.MALFORMED, self.random_body),
            (DropReason.MALFORMED, self.kind_mismatch),
            (DropReason.MALFORMED, self.bad_array),
            (DropReason.MALFORMED, self.single_frame),
            (DropReason.OVERSIZED, self.oversized),
            (DropReason.UNSUPPORTED_VERSION, self.wrong_version),
        ]

    def random_frames(self) -> Frames:
        topic = b"zz" + self.rng.randbytes(self.rng.randrange(0, 30))
        return [topic] + [self.rng.randbytes(self.rng.randrange(0, 80)) for _ in range(self.rng.randrange(1, 4))]

    def truncated_body(self) -> Frames:
        body = self.good[1]
        return [self.good[0], body[: self.rng.randrange(0, len(body))]]

    def random_body(self) -> Frames:
        return [b"gen.request", self.rng.randbytes(self.rng.randrange(0, 120))]

    def kind_mismatch(self) -> Frames:
        return [b"inst.status", self.good[1]]

    def bad_array(self) -> Frames:
        body = bytearray(self.array[1])
        index = body.find(b"<i4")
        body[index + self.rng.randrange(0, 12)] ^= 1 + self.rng.randrange(255)
        extra = [self.array[2], b"surplus"] if self.rng.random() < 0.5 else []
        return [self.array[0], bytes(body), *extra]

    def single_frame(self) -> Frames:
        return [self.good[0]]

    def oversized(self) -> Frames:
        return [self.good[0], self.good[1] + b"\0" * MAX_MESSAGE_BYTES]

    def wrong_version(self) -> Frames:
        raw = msgspec.msgpack.decode(self.good[1])
        raw[0][0][1] = self.rng.choice([0, 2, 99, 2**40])
        return [self.good[0], msgspec.msgpack.encode(raw)]

    def messages(self, count: int) -> Iterator[tuple[DropReason, Frames]]:
        for i in range(count):
            reason, make = self.categories[i % len(self.categories)]
            yield reason, make()


def _send(socket: zmq.Socket, frames: Frames) -> None:
    socket.send_multipart(frames)


def _receive_loop(receive: Callable[[], object], stop: threading.Event, handled: list, errors: list) -> None:
    try:
        while not stop.is_set():
            item = receive()
            if item is not None:
                handled.append(item)
    except Exception as exc:  # the test fails if anything escapes the receiver
        errors.append(exc)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def test_subscriber_survives_100k_bad_messages(ctx: zmq.Context) -> None:
    options = SocketOptions(hwm=0)  # unbounded: every message must arrive to be counted
    sender = make_socket(ctx, zmq.PUB, "tcp://127.0.0.1:*", options=options, bind=True)
    address = sender.getsockopt(zmq.LAST_ENDPOINT).decode()
    sub = Subscriber(ctx, address, options=options, max_message_bytes=MAX_MESSAGE_BYTES, name="fuzz")
    _wait_for_subscription(sender, sub)
    stop, handled, errors = threading.Event(), [], []
    thread = threading.Thread(target=_receive_loop, args=(lambda: sub.recv(50), stop, handled, errors))
    thread.start()
    fuzzer = Fuzzer(seed=3)
    expected = dict.fromkeys(DropReason, 0)
    for reason, frames in fuzzer.messages(NUM_FUZZ):
        expected[reason] += 1
        _send(sender, frames)
    _send(sender, _valid(seq=42))
    try:
        _wait_for(lambda: bool(handled) or bool(errors))
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert [e.message.step for e in handled] == [42]
    assert sub.drops.total == NUM_FUZZ
    assert sub.drops.counts == expected
    sender.close(0)
    sub.close()


def _wait_for_subscription(sender: zmq.Socket, sub: Subscriber) -> None:
    """Send good probes until one arrives, then drain, so fuzz messages are not lost to slow joining."""
    for seq in range(1000):
        _send(sender, _valid(seq))
        if sub.recv(20) is not None:
            break
    while sub.recv(100) is not None:
        pass
    sub.drops.counts = dict.fromkeys(DropReason, 0)


def _next_event(link: Link) -> object | None:
    received = link.recv() if link.socket.poll(50) else None
    return received[1][0] if received and received[1] else None


def test_a_serving_link_survives_bad_messages(ctx: zmq.Context) -> None:
    link = Link(ctx, "tcp://127.0.0.1:*", sender="fuzz", serve=True, max_message_bytes=MAX_MESSAGE_BYTES)
    client = make_socket(ctx, zmq.DEALER, bound_address(link.socket), options=SocketOptions(hwm=0))
    stop, handled, errors = threading.Event(), [], []
    thread = threading.Thread(target=_receive_loop, args=(lambda: _next_event(link), stop, handled, errors))
    thread.start()
    num_bad = NUM_FUZZ // 10
    for _, frames in Fuzzer(seed=5).messages(num_bad):
        _send(client, frames)
    _send(client, _valid(seq=7))
    try:
        _wait_for(lambda: bool(handled) or bool(errors))
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert [e.message.step for e in handled] == [7]  # type: ignore[attr-defined]
    assert link.drops.total == num_bad
    client.close(0)
    link.close()
