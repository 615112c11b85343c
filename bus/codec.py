"""Wire codec: a ZeroMQ message is frames ``[kind, body, *array_frames]``.

``kind`` is the ASCII kind name (the pub/sub topic). ``body`` is a msgpack array of one or more
events ``[envelope, message]`` of that kind (both positional structs): a publisher may batch
several events of one kind into one ZeroMQ message to save per-message cost. Each trailing
frame is the raw buffer of one large array referenced from the body (see `bus.arrays`).
Decoding is typed per kind; every failure becomes a `DecodeError` with a `DropReason`, so a
receiver can count it and move on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import zmq

import bus.messages  # noqa: F401  (registers every kind in CATALOGUE)
from bus import upgrade
from bus.arrays import MAX_ARRAY_FRAMES, VECTOR_EXT, Buffer, decode_array, decode_vector, encode_array
from bus.errors import DecodeError, DropReason
from bus.schema import CATALOGUE, Envelope, Event, Message

DEFAULT_ARRAY_FRAME_BYTES = 64 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_MAX_KIND_BYTES = 64


class Encoder:
    """Encodes events into frames. One per thread (it reuses internal state)."""

    def __init__(self, array_frame_bytes: int = DEFAULT_ARRAY_FRAME_BYTES) -> None:
        self._threshold = array_frame_bytes
        self._frames: list[Buffer] = []
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)

    def _enc_hook(self, obj: Any) -> Any:
        return encode_array(obj, self._frames, self._threshold)

    def encode(self, envelope: Envelope, message: Message) -> list[Buffer]:
        """Frames of one event."""
        self._frames = []
        body = self._encoder.encode(((envelope, message),))
        return [message.KIND_BYTES, body, *self._frames]

    def encode_batch(self, events: Sequence[tuple[Envelope, Message]]) -> list[Buffer]:
        """Frames of several events of one kind, sent as one ZeroMQ message."""
        if not events:
            raise ValueError("a batch needs at least one event")
        kind = events[0][1].KIND_BYTES
        if any(kind != message.KIND_BYTES for _, message in events):
            raise ValueError("every event of a batch must be of the same kind (the topic frame)")
        self._frames = []
        body = self._encoder.encode(events)
        return [kind, body, *self._frames]


def frame_buffer(frame: Any) -> Buffer:
    """A buffer view of a received frame (bytes as is, zmq.Frame without copying)."""
    if isinstance(frame, bytes):
        return frame
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return memoryview(frame)


class Decoder:
    """Typed decoding of received frames, with size limits and schema upgrades.

    Not thread-safe: the array hook reads the frames of the message being decoded.
    """

    def __init__(
        self,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        catalogue: Mapping[str, type[Message]] = CATALOGUE,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self._catalogue = dict(catalogue)
        self._typed = {kind.encode(): (cls, self._typed_decoder(cls)) for kind, cls in self._catalogue.items()}
        self._generic = msgspec.msgpack.Decoder(ext_hook=self._ext_hook)
        self._array_frames: Sequence[Buffer] = ()
        self._used_frames: list[int] = []

    def _typed_decoder(self, cls: type[Message]) -> msgspec.msgpack.Decoder[Any]:
        body_type: Any = list[Event[cls]]  # type: ignore[valid-type]
        return msgspec.msgpack.Decoder(body_type, ext_hook=self._ext_hook, dec_hook=_dec_hook)

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == VECTOR_EXT:
            return decode_vector(data)
        return decode_array(code, data, self._array_frames, self._used_frames)

    def decode(self, frames: Sequence[Any]) -> list[Event[Any]]:
        """The typed events of one message; raises DecodeError (never anything else) when it is bad."""
        try:
            return self._decode(frames)
        except DecodeError:
            raise
        except Exception as exc:  # hostile bytes must never escape as a crash
            raise DecodeError(DropReason.MALFORMED, f"{type(exc).__name__}: {exc}") from exc

    def decode_one(self, frames: Sequence[Any]) -> Event[Any]:
        """The single event of a message that must hold exactly one (requests and replies)."""
        events = self.decode(frames)
        if len(events) != 1:
            raise DecodeError(DropReason.MALFORMED, f"expected one event, got a batch of {len(events)}")
        return events[0]

    def _decode(self, frames: Sequence[Any]) -> list[Event[Any]]:
        buffers = _checked_buffers(frames, self.max_message_bytes)
        kind_bytes = buffers[0] if type(buffers[0]) is bytes else bytes(buffers[0])
        entry = self._typed.get(kind_bytes)
        if entry is None:
            return self._decode_renamed(kind_bytes, buffers)
        cls, typed = entry
        num_array_frames = len(buffers) - 2
        if num_array_frames:
            self._array_frames = buffers[2:]
        self._used_frames.clear()
        try:
            events: list[Event[Any]] = typed.decode(buffers[1])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._decode_old(cls, buffers, exc)
        finally:
            self._array_frames = ()
        if not events:
            raise DecodeError(DropReason.MALFORMED, "empty batch")
        for event in events:
            envelope = event.envelope
            if envelope.kind != cls.KIND:
                raise DecodeError(DropReason.MALFORMED, f"topic {cls.KIND!r} but envelope kind {envelope.kind!r}")
            if envelope.schema_version != cls.SCHEMA_VERSION:
                return self._decode_old(cls, buffers, None)
        if num_array_frames or self._used_frames:
            self._check_frames_used(num_array_frames)
        return events

    def _decode_old(self, cls: type[Message], buffers: Sequence[Buffer], error: Exception | None) -> list[Event[Any]]:
        """Decode events of other schema versions through their upgrade functions."""
        events = [self._upgraded(cls, item, error) for item in self._generic_items(cls.KIND, buffers)]
        self._check_frames_used(len(buffers) - 2)
        return events

    def _generic_items(self, kind: str, buffers: Sequence[Buffer]) -> list[Any]:
        """A body decoded without its kind's schema (its array frames at hand): the list of its events."""
        self._array_frames = buffers[2:]
        self._used_frames.clear()
        try:
            raw = self._generic.decode(buffers[1])
        finally:
            self._array_frames = ()
        if not isinstance(raw, list) or not raw:
            raise DecodeError(DropReason.MALFORMED, f"{kind}: body is not a non-empty array of events")
        return raw

    def _decode_renamed(self, kind_bytes: bytes, buffers: Sequence[Buffer]) -> list[Event[Any]]:
        """Events of a kind that left the protocol: read as the kind that replaced it, or refused with why."""
        kind = kind_bytes[:_MAX_KIND_BYTES].decode("ascii", "replace")
        if kind in upgrade.REMOVED_KINDS:
            raise DecodeError(DropReason.UNKNOWN_KIND, f"kind {kind!r} {upgrade.REMOVED_KINDS[kind]}")
        rename = upgrade.RENAMED_KINDS.get(kind)
        if rename is None:
            raise DecodeError(DropReason.UNKNOWN_KIND, f"kind {kind_bytes[:_MAX_KIND_BYTES]!r} is not in the catalogue")
        events = [self._renamed(kind, rename, item) for item in self._generic_items(kind, buffers)]
        self._check_frames_used(len(buffers) - 2)
        return events

    def _renamed(self, kind: str, rename: upgrade.RenameFn, item: Any) -> Event[Any]:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list) and isinstance(item[1], list)):
            raise DecodeError(DropReason.MALFORMED, f"{kind}: not an [envelope, message] pair")
        if len(item[0]) < 3 or item[0][0] != kind:
            raise DecodeError(DropReason.MALFORMED, f"topic {kind!r} but envelope {item[0][:1]!r}")
        new_kind, payload = rename(item[0], item[1])
        cls = self._catalogue.get(new_kind)
        if cls is None:
            raise DecodeError(DropReason.UNKNOWN_KIND, f"{kind} is now {new_kind!r}, which this reader does not know")
        envelope_fields = [new_kind, 1, *item[0][2:]]
        envelope_fields, payload = upgrade.upgrade(new_kind, 1, cls.SCHEMA_VERSION, envelope_fields, payload)
        try:
            envelope = msgspec.convert(envelope_fields, Envelope)
            message = msgspec.convert(payload, cls, dec_hook=_dec_hook)
        except msgspec.ValidationError as exc:
            raise DecodeError(DropReason.MALFORMED, f"{kind} read as {new_kind}: {exc}") from exc
        return Event(envelope, message)

    def _upgraded(self, cls: type[Message], item: Any, error: Exception | None) -> Event[Any]:
        version = _raw_schema_version(item)
        if version is None or (version == cls.SCHEMA_VERSION and error is not None):
            raise DecodeError(DropReason.MALFORMED, f"{cls.KIND}: {error or 'not an [envelope, message] pair'}")
        if version > cls.SCHEMA_VERSION:
            raise DecodeError(
                DropReason.UNSUPPORTED_VERSION,
                f"{cls.KIND} schema version {version} is newer than this reader's {cls.SCHEMA_VERSION}",
            )
        envelope_fields, payload = upgrade.upgrade(cls.KIND, version, cls.SCHEMA_VERSION, item[0], item[1])
        try:
            envelope = msgspec.convert(envelope_fields, Envelope)
            message = msgspec.convert(payload, cls, dec_hook=_dec_hook)
        except msgspec.ValidationError as exc:
            raise DecodeError(DropReason.MALFORMED, f"{cls.KIND} upgraded from version {version}: {exc}") from exc
        if envelope.kind != cls.KIND:
            raise DecodeError(DropReason.MALFORMED, f"topic {cls.KIND!r} but envelope kind {envelope.kind!r}")
        return Event(envelope, message)

    def _check_frames_used(self, num_frames: int) -> None:
        if sorted(self._used_frames) != list(range(num_frames)):
            raise DecodeError(
                DropReason.MALFORMED, f"{num_frames} array frame(s) but references {sorted(self._used_frames)}"
            )


def _dec_hook(type_: type, obj: Any) -> Any:
    if type(obj) is np.ndarray and type_ is np.ndarray:
        return obj
    raise NotImplementedError(f"cannot decode {type(obj).__name__} as {type_}")


def _checked_buffers(frames: Sequence[Any], max_message_bytes: int) -> Sequence[Buffer]:
    num_frames = len(frames)
    if num_frames == 2 and type(frames[0]) is bytes and type(frames[1]) is bytes:
        buffers: Sequence[Buffer] = frames  # the common small message: no conversion
        total = len(frames[0]) + len(frames[1])
    else:
        if num_frames < 2:
            raise DecodeError(DropReason.MALFORMED, f"{num_frames} frame(s); an event has at least kind and body")
        if num_frames > 2 + MAX_ARRAY_FRAMES:
            raise DecodeError(DropReason.MALFORMED, f"{num_frames} frames (at most {2 + MAX_ARRAY_FRAMES})")
        buffers = [frame_buffer(f) for f in frames]
        total = sum(len(b) for b in buffers)
    if total > max_message_bytes:
        raise DecodeError(DropReason.OVERSIZED, f"{total} bytes (limit {max_message_bytes})")
    if len(buffers[0]) > _MAX_KIND_BYTES:
        raise DecodeError(DropReason.UNKNOWN_KIND, f"topic frame of {len(buffers[0])} bytes")
    return buffers


def _raw_schema_version(item: Any) -> int | None:
    """schema_version of an untyped ``[envelope, message]`` pair, or None if it is not one."""
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list) and isinstance(item[1], list)):
        return None
    envelope = item[0]
    if len(envelope) < 2 or not isinstance(envelope[1], int) or isinstance(envelope[1], bool):
        return None
    return int(envelope[1])
