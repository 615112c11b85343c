"""Publishing events: envelope stamping, encoding and a non-blocking send on the right channel.

A `Publisher` belongs to one actor incarnation and one thread (ZeroMQ sockets are not
thread-safe). It numbers every event it sends 1, 2, 3, ... across both channels, which is what
lets receivers and the replay count lost events.

Its sockets are XPUB rather than PUB: they see the subscriptions forwarded by the proxy, so
`wait_subscribed` can hold the first events until someone (the event logger) listens, instead
of losing them to the ZeroMQ slow-joiner race.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import zmq

from bus.addresses import BusAddresses
from bus.codec import DEFAULT_ARRAY_FRAME_BYTES, Encoder
from bus.errors import BusError
from bus.io import send_frames
from bus.schema import Channel, Envelope, Message
from bus.sockets import DEFAULT_SOCKET_OPTIONS, SocketOptions, make_socket
from bus.stamp import Cause, Stamper

DEFAULT_PUBLISHER_LINGER_MS = 2000  # let an exiting actor's last events (ActorDead) leave
MAX_BATCH = 1024  # events per ZeroMQ message in publish_many


class Publisher:
    """Stamps and sends events of one actor incarnation on the events and control proxies."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        addresses: BusAddresses,
        sender: str,
        incarnation: int = 0,
        *,
        options: SocketOptions = DEFAULT_SOCKET_OPTIONS,
        array_frame_bytes: int = DEFAULT_ARRAY_FRAME_BYTES,
        linger_ms: int = DEFAULT_PUBLISHER_LINGER_MS,
        cause: Cause | None = None,
    ) -> None:
        # One numbered stream per channel: the two proxies may reorder events between channels,
        # never within one, so per-channel numbering keeps "missing" meaning "lost".
        self.stampers = {
            Channel.EVENTS: Stamper(sender, incarnation, cause),
            Channel.CONTROL: Stamper(f"{sender}/ctl", incarnation, cause),
        }
        self.stamper = self.stampers[Channel.EVENTS]
        self._encoder = Encoder(array_frame_bytes)
        self._sockets: dict[Channel, zmq.Socket[bytes]] = {}
        try:
            for channel, address in ((Channel.EVENTS, addresses.events_in), (Channel.CONTROL, addresses.control_in)):
                self._sockets[channel] = make_socket(
                    ctx, zmq.XPUB, address, options=options, bind=False, linger_ms=linger_ms
                )
        except BusError:
            self.close()
            raise
        self._subscriptions: dict[Channel, set[bytes]] = {channel: set() for channel in self._sockets}

    def publish(
        self,
        message: Message,
        *,
        parent: str | None = None,
        model_version: int | None = None,
        request_id: int | None = None,
        prompt_id: int | None = None,
    ) -> Envelope:
        """Send one event; never blocks (a full subscriber queue drops it for that subscriber)."""
        envelope = self.stampers[message.CHANNEL].stamp(message, parent, model_version, request_id, prompt_id)
        frames = self._encoder.encode(envelope, message)
        send_frames(self._sockets[message.CHANNEL], frames)
        return envelope

    def forward(self, frames: list[Any]) -> None:
        """Publish frames another stream stamped and encoded (a link's record of what it sent) on the
        events channel, as they are: every copy of one stream takes one path, so its order holds."""
        send_frames(self._sockets[Channel.EVENTS], frames)

    def publish_many(
        self,
        messages: Sequence[Message],
        *,
        parent: str | None = None,
        model_version: int | None = None,
        request_ids: Sequence[int | None] | None = None,
        prompt_ids: Sequence[int | None] | None = None,
    ) -> list[Envelope]:
        """Send several events, batching each run of same-kind messages into one ZeroMQ message.

        Every event still gets its own envelope and sequence number; `request_ids` and
        `prompt_ids`, when given, hold one entry per message. Batching saves the per-message cost
        of ZeroMQ and of the receiver (one receive and one decode call per batch), which is what
        lets a busy actor publish at high rates; a subscriber sees the same events either way.
        """
        num = len(messages)
        if (request_ids is not None and len(request_ids) != num) or (prompt_ids is not None and len(prompt_ids) != num):
            raise BusError(f"request_ids and prompt_ids must hold one entry per message ({num})")
        no_ids: list[int | None] = [None] * num
        stamped = [
            (self.stampers[message.CHANNEL].stamp(message, parent, model_version, request_id, prompt_id), message)
            for message, request_id, prompt_id in zip(
                messages, request_ids or no_ids, prompt_ids or no_ids, strict=True
            )
        ]
        start = 0
        while start < num:
            kind = messages[start].KIND
            end = start + 1
            while end < num and kind == messages[end].KIND and end - start < MAX_BATCH:
                end += 1
            frames = self._encoder.encode_batch(stamped[start:end])
            send_frames(self._sockets[messages[start].CHANNEL], frames)
            start = end
        return [envelope for envelope, _ in stamped]

    def wait_subscribed(
        self,
        timeout_s: float,
        channels: tuple[Channel, ...] = (Channel.EVENTS, Channel.CONTROL),
        prefix: str | None = None,
    ) -> bool:
        """Wait until each channel has a subscription; False on timeout.

        With `prefix`, wait for that exact subscription: ``prefix=""`` waits for a subscriber to
        every kind, which is what the event logger is, so no event of this actor misses the log.
        """
        deadline = time.monotonic() + timeout_s
        wanted = None if prefix is None else prefix.encode()
        for channel in channels:
            socket = self._sockets[channel]
            seen = self._subscriptions[channel]
            while not seen if wanted is None else wanted not in seen:
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0 or not socket.poll(remaining_ms):
                    return False
                self._read_subscriptions(channel)
        return True

    def _read_subscriptions(self, channel: Channel) -> None:
        socket = self._sockets[channel]
        while socket.poll(0):
            update = socket.recv()
            if update[:1] == b"\x01":
                self._subscriptions[channel].add(update[1:])
            elif update[:1] == b"\x00":
                self._subscriptions[channel].discard(update[1:])

    def close(self) -> None:
        for socket in self._sockets.values():
            socket.close()
        self._sockets.clear()
