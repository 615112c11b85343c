"""Codec details: frame layout, size limits, array checks, and the addresses file."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from bus.addresses import BUS_FILE, BusAddresses, ipc_dir, plan_addresses
from bus.arrays import MAX_ARRAY_FRAMES
from bus.codec import Decoder, Encoder
from bus.errors import BusError, DecodeError, DropReason
from bus.gaps import GapTracker
from bus.messages import FinishReason, GenerateResult, Metrics
from bus.schema import Envelope
from bus.stamp import Stamper


def _result(token_ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray) -> GenerateResult:
    return GenerateResult(
        request_id=1,
        prompt_id=0,
        token_ids=token_ids,
        logprobs=logprobs,
        versions=versions,
        finish_reason=FinishReason.STOP,
        instance="i0",
    )


def _chunk(num_tokens: int) -> GenerateResult:
    """A result of ``num_tokens`` tokens: three arrays (tokens, log-probs, versions)."""
    tokens = np.arange(num_tokens, dtype=np.int32)
    return _result(tokens, np.zeros(num_tokens, np.float32), tokens.copy())


def _env(kind: str = "gen.result") -> Envelope:
    return Envelope(kind, 1, "rollout-0", 0, 1, 2, 3)


def test_first_frame_is_the_kind_and_body_is_envelope_then_message() -> None:
    frames = Encoder().encode(_env("obs.metrics"), Metrics(4, {"a": 1.0}))
    assert frames[0] == b"obs.metrics"
    ((envelope, message),) = msgspec.msgpack.decode(frames[1])  # a batch of one event
    assert envelope[:5] == ["obs.metrics", 1, "rollout-0", 0, 1]
    assert message == [4, {"a": 1.0}, {}]  # notes: array-like structs encode every field


def test_frame_arrays_are_neither_copied_to_send_nor_after_receiving() -> None:
    chunk = _chunk(100)
    frames = Encoder(array_frame_bytes=64).encode(_env(), chunk)
    assert len(frames) == 5
    event = Decoder().decode_one(frames)
    assert np.shares_memory(event.message.token_ids, chunk.token_ids)
    small = Decoder().decode_one(Encoder().encode(_env(), chunk))  # inline arrays are copied out of the body
    assert not np.shares_memory(small.message.token_ids, chunk.token_ids)


def test_oversized_messages_are_refused_before_decoding() -> None:
    frames = Encoder(array_frame_bytes=64).encode(_env(), _chunk(10_000))
    with pytest.raises(DecodeError) as caught:
        Decoder(max_message_bytes=10_000).decode(frames)
    assert caught.value.reason is DropReason.OVERSIZED


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [
        (lambda f: [*f, b"extra"], "references"),
        (lambda f: f[:3], "refers to frame"),
        (lambda f: [f[0], f[1], f[2][:-4], *f[3:]], "needs"),
        (lambda f: [f[0], f[1], *[b"x"] * (MAX_ARRAY_FRAMES + 1)], r"frames \(at most"),
    ],
)
def test_array_frames_must_match_their_references(mutate: object, detail: str) -> None:
    frames = Encoder(array_frame_bytes=64).encode(_env(), _chunk(100))
    with pytest.raises(DecodeError, match=detail) as caught:
        Decoder().decode(mutate(frames))  # type: ignore[operator]
    assert caught.value.reason is DropReason.MALFORMED


def test_object_dtype_headers_are_refused() -> None:
    chunk = _result(np.zeros((2, 2), np.int32), np.zeros(2, np.float32), np.zeros(2, np.int32))
    frames = Encoder().encode(_env(), chunk)  # a 2-D array carries the full header with its dtype name
    forged = frames[1].replace(b"<i4", b"|O8", 1)
    with pytest.raises(DecodeError, match="not allowed"):
        Decoder().decode([frames[0], forged])


def test_vectors_have_a_one_byte_header_and_decode_read_only() -> None:
    frames = Encoder().encode(_env(), _chunk(4))
    assert b"<i4" not in frames[1]
    event = Decoder().decode_one(frames)
    assert event.message.token_ids.tolist() == [0, 1, 2, 3]
    assert not event.message.token_ids.flags.writeable
    body = bytearray(frames[1])
    marker = bytes([0xC7, 17, 3, 5])  # ext8 of 17 bytes, ext type 3 (vector), dtype code 5 (<i4)
    body[body.index(marker) + 3] = 200
    with pytest.raises(DecodeError, match="bad vector dtype code"):
        Decoder().decode([frames[0], bytes(body)])


def test_sender_names_cannot_break_event_ids() -> None:
    for bad in ("", "a#b", "a:b", "tab\there"):
        with pytest.raises(BusError):
            Stamper(bad)
    stamper = Stamper("router", 3)
    assert stamper.stamp(Metrics(1, {})).event_id == "router#3:1"
    assert stamper.stamp(Metrics(2, {})).seq == 2


def test_gap_tracker_counts_missing_and_takes_back_late_events() -> None:
    tracker = GapTracker(from_first_seen=False)
    for seq in (1, 2, 5, 3, 6):
        tracker.observe(Envelope("obs.metrics", 1, "a", 0, seq, 0, 0))
    state = tracker.senders[("a", 0)]
    assert (state.num_missing, state.num_late, state.next_seq) == (1, 1, 7)


def test_addresses_round_trip_through_bus_json(tmp_path: Path) -> None:
    addresses = BusAddresses("ipc:///x/a", "ipc:///x/b", "ipc:///x/c", "ipc:///x/d", curve_dir="/keys")
    addresses.save(tmp_path)
    assert BusAddresses.load(tmp_path) == addresses
    assert json.loads((tmp_path / BUS_FILE).read_text())["events_out"] == "ipc:///x/b"


def test_bad_bus_json_is_named(tmp_path: Path) -> None:
    (tmp_path / BUS_FILE).write_text('{"events_in": "x"}')
    with pytest.raises(BusError, match="lacks bus addresses"):
        BusAddresses.load(tmp_path)
    (tmp_path / BUS_FILE).write_text("{")
    with pytest.raises(BusError, match="not readable JSON"):
        BusAddresses.load(tmp_path)


def test_long_run_paths_get_a_short_ipc_directory(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    assert len(str(ipc_dir(deep))) < 40
    assert ipc_dir(deep) == ipc_dir(deep)  # stable, so every actor derives the same one
    plan = plan_addresses(deep)
    assert all(len(a) < 107 for a in (plan.events_in, plan.control_out))
    assert plan_addresses(tmp_path, "tcp").events_in == "tcp://127.0.0.1:*"


def test_a_batch_decodes_to_its_events_in_order() -> None:
    stamper = Stamper("router")
    messages = [_chunk(n) for n in (1, 2, 3)]
    frames = Encoder().encode_batch([(stamper.stamp(m), m) for m in messages])
    events = Decoder().decode(frames)
    assert [e.envelope.seq for e in events] == [1, 2, 3]
    assert [len(e.message.token_ids) for e in events] == [1, 2, 3]
    with pytest.raises(DecodeError, match="expected one event"):
        Decoder().decode_one(frames)


def test_batches_are_all_or_nothing() -> None:
    good = Envelope("gen.result", 1, "router", 0, 1, 2, 3)
    liar = Envelope("obs.metrics", 1, "router", 0, 2, 2, 3)
    frames = Encoder().encode_batch([(good, _chunk(1)), (liar, _chunk(1))])  # the second envelope lies
    with pytest.raises(DecodeError, match="envelope kind"):
        Decoder().decode(frames)
    with pytest.raises(DecodeError, match="empty batch"):
        Decoder().decode([b"gen.result", msgspec.msgpack.encode([])])
    with pytest.raises(ValueError, match="same kind"):
        Encoder().encode_batch([(good, _chunk(1)), (liar, Metrics(1, {}))])
