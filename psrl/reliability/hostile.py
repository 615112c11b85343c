"""Hostile frames for fuzzing live sockets: seeded, one category after another, never a valid command.

Categories: random bytes (any number of frames), a real kind with a truncated body, random
bytes or wrongly typed fields, a body of another kind, an unsupported schema version, an empty
message, an oversized frame, and a replayed, out-of-order but well-formed heartbeat from a sender
that is no actor (well-formed, but no receiver handles it on a link, and the supervisor ignores
unknown senders). Nothing here is a valid instance of a kind its receiver would act on: the
fuzzer tests that bad input is counted and dropped, not that forged commands are refused (that
is what CURVE is for, see docs/security.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import msgspec

from bus.codec import Encoder
from bus.messages import ActorState, Heartbeat, Metrics
from bus.schema import CATALOGUE, Envelope

Frames = list[bytes]
FUZZ_SENDER = "fuzzer"


class HostileFrames:
    """Makes bad messages; ``oversized_every`` spaces out the expensive oversized ones."""

    def __init__(self, seed: int, *, max_message_bytes: int, oversized_every: int = 1000) -> None:
        self.rng = random.Random(seed)
        self.max_message_bytes = max_message_bytes
        self.oversized_every = oversized_every
        self.kinds = sorted(CATALOGUE)
        self.encoder = Encoder()
        good = self.encoder.encode(Envelope("obs.metrics", 1, FUZZ_SENDER, 0, 1, 1, 2), Metrics(1, {"x": 0.5}))
        self.good = [bytes(f) for f in good]
        self.makers: list[Callable[[], Frames]] = [
            self.random_frames,
            self.truncated,
            self.random_body,
            self.wrong_types,
            self.other_kinds_body,
            self.wrong_version,
            self.empty,
            self.replayed,
        ]
        self.seq = 0

    def frames(self, count: int) -> Iterator[Frames]:
        for i in range(count):
            if self.oversized_every and i % self.oversized_every == self.oversized_every - 1:
                yield self.oversized()
            else:
                yield self.makers[i % len(self.makers)]()

    def _kind(self) -> bytes:
        return self.rng.choice(self.kinds).encode()

    def random_frames(self) -> Frames:
        return [self.rng.randbytes(self.rng.randrange(0, 64)) for _ in range(self.rng.randrange(1, 5))]

    def truncated(self) -> Frames:
        body = self.good[1]
        return [self._kind(), body[: self.rng.randrange(0, len(body))]]

    def random_body(self) -> Frames:
        return [self._kind(), self.rng.randbytes(self.rng.randrange(0, 200))]

    def wrong_types(self) -> Frames:
        envelope = [self._kind().decode(), 1, FUZZ_SENDER, 0, self.rng.randrange(1 << 30), 1, 2]
        # the first field a map of lists, which no kind's first field accepts: never valid
        fields = [{"\x00": [None]}] + [self.rng.choice([None, "xxx", -1, 1.5, [1, 2], {"a": 1}]) for _ in range(5)]
        kind = envelope[0]
        return [str(kind).encode(), msgspec.msgpack.encode([[envelope, fields]])]

    def other_kinds_body(self) -> Frames:
        kind = self._kind()
        while kind == self.good[0]:
            kind = self._kind()
        return [kind, self.good[1]]

    def wrong_version(self) -> Frames:
        raw = msgspec.msgpack.decode(self.good[1])
        raw[0][0][1] = self.rng.choice([0, 2, 99, 2**40])
        return [self.good[0], msgspec.msgpack.encode(raw)]

    def empty(self) -> Frames:
        return [b""]

    def oversized(self) -> Frames:
        return [self.good[0], self.good[1] + b"\0" * self.max_message_bytes]

    def is_oversized(self, frames: Frames) -> bool:
        return sum(len(f) for f in frames) > self.max_message_bytes

    def replayed(self) -> Frames:
        """A well-formed heartbeat of no actor, its sequence number going backwards."""
        self.seq = self.seq - 1 if self.seq > 1 else 1000
        envelope = Envelope("actor.heartbeat", 1, FUZZ_SENDER, 0, self.seq, 1, 2)
        return [bytes(f) for f in self.encoder.encode(envelope, Heartbeat(ActorState.READY, 0))]
