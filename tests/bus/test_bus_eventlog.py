"""Event log: records survive, rotation keeps order, torn and corrupt parts are reported, not fatal."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from bus_helpers import wait_connected

from bus.addresses import BusAddresses
from bus.codec import Encoder
from bus.eventlog import EventLogger, EventLogReader, EventLogWriter
from bus.eventlog.format import HEADER, RECORD_HEADER, newest_segment
from bus.eventlog.logger import EventLogFailedError
from bus.messages import FinishReason, GenerateResult, Metrics, Pause, WeightsPublished
from bus.publisher import Publisher
from bus.schema import Envelope
from bus.sockets import make_socket


def _frames(seq: int, sender: str = "trainer") -> list:
    envelope = Envelope("obs.metrics", 1, sender, 0, seq, seq, 1_000 + seq)
    return Encoder().encode(envelope, Metrics(seq, {"loss": seq / 10}))


def _write(directory: Path, num_events: int, **kwargs: object) -> EventLogWriter:
    writer = EventLogWriter(directory, **kwargs)  # type: ignore[arg-type]
    for seq in range(1, num_events + 1):
        writer.append(_frames(seq))
    writer.close()
    return writer


def _steps(reader: EventLogReader) -> list[int]:
    return [logged.event.message.step for logged in reader.events()]


@pytest.mark.parametrize("fsync", ["never", "segment", "always"])
def test_records_read_back_in_order_across_rotated_segments(tmp_path: Path, fsync: str) -> None:
    writer = _write(tmp_path, 300, segment_bytes=4096, fsync=fsync)
    reader = EventLogReader(tmp_path)
    assert len(reader.segments()) == writer.segment > 3
    assert _steps(reader) == list(range(1, 301))
    assert reader.problems == []


def test_array_frames_are_stored_and_decoded(tmp_path: Path) -> None:
    chunk = GenerateResult(
        request_id=3,
        prompt_id=0,
        token_ids=np.arange(5000, dtype=np.int32),
        logprobs=np.zeros(5000, np.float32),
        versions=np.ones(5000, np.int32),
        finish_reason=FinishReason.STOP,
        instance="i0",
    )
    frames = Encoder(array_frame_bytes=1024).encode(Envelope("gen.result", 1, "rollout", 0, 1, 2, 3), chunk)
    assert len(frames) == 5
    writer = EventLogWriter(tmp_path)
    writer.append(frames)
    writer.close()
    (logged,) = list(EventLogReader(tmp_path).events())
    assert np.array_equal(logged.event.message.token_ids, chunk.token_ids)


def test_torn_tail_keeps_every_whole_record_and_reports_the_cut(tmp_path: Path) -> None:
    _write(tmp_path, 50)
    (segment,) = EventLogReader(tmp_path).segments()
    size = segment.stat().st_size
    last_record = _offsets(tmp_path)[-1]
    cut = last_record + (size - last_record) // 2  # half of the last record
    os.truncate(segment, cut)
    reader = EventLogReader(tmp_path)
    assert _steps(reader) == list(range(1, 50))
    (problem,) = reader.problems
    assert problem.offset == last_record
    assert "torn tail" in problem.reason
    assert problem.num_bytes_skipped == cut - last_record


def test_cut_inside_a_record_header_is_a_torn_tail_too(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    (segment,) = EventLogReader(tmp_path).segments()
    last_record = _offsets(tmp_path)[-1]
    os.truncate(segment, last_record + 3)
    reader = EventLogReader(tmp_path)
    assert _steps(reader) == [1, 2, 3, 4]
    assert "record header cut" in reader.problems[0].reason


def test_corruption_mid_log_skips_rest_of_that_segment_only(tmp_path: Path) -> None:
    _write(tmp_path, 200, segment_bytes=4096)
    reader = EventLogReader(tmp_path)
    first, second = reader.segments()[:2]
    offsets = [r.offset for r in reader.records() if r.segment == first]
    data = bytearray(first.read_bytes())
    data[offsets[3] + RECORD_HEADER.size + 5] ^= 0xFF  # one flipped bit in record 4's payload
    first.write_bytes(bytes(data))
    reader = EventLogReader(tmp_path)
    steps = _steps(reader)
    assert steps[:3] == [1, 2, 3]
    assert 4 not in steps
    assert steps[3] == len(offsets) + 1  # reading resumes with the next segment
    (problem,) = reader.problems
    assert (problem.segment, problem.offset, problem.reason) == (str(first), offsets[3], "checksum mismatch")
    assert second.exists()


def test_bad_segment_header_and_undecodable_records_are_reported(tmp_path: Path) -> None:
    writer = EventLogWriter(tmp_path)
    writer.append([b"obs.metrics", b"\xc1 not msgpack"])
    writer.append(_frames(1))
    writer.close()
    (tmp_path / "00000009.seg").write_bytes(b"garbage that is no segment header")
    reader = EventLogReader(tmp_path)
    assert _steps(reader) == [1]
    reasons = sorted(p.reason.split(":")[0] for p in reader.problems)
    assert reasons == ["not a psrl event-log segment (bad magic)", "undecodable event"]


def test_restarted_writer_never_appends_to_an_old_segment(tmp_path: Path) -> None:
    _write(tmp_path, 3)
    (old,) = EventLogReader(tmp_path).segments()
    os.truncate(old, old.stat().st_size - 2)  # the crash left a torn tail
    writer = EventLogWriter(tmp_path)
    writer.append(_frames(4))
    writer.close()
    reader = EventLogReader(tmp_path)
    assert _steps(reader) == [1, 2, 4]
    assert len(reader.problems) == 1 and reader.problems[0].segment == str(old)


def test_events_of_some_kinds_from_a_segment_on(tmp_path: Path) -> None:
    """Only the kinds asked for, from the segment asked on: a new launch's logger starts the next segment."""
    published = Envelope("wt.published", 1, "ps-0", 0, 1, 1, 1_000)
    for launch_version in (4, 7):  # two loggers (launches), each its own segment
        writer = EventLogWriter(tmp_path)
        writer.append(_frames(launch_version))
        writer.append(Encoder().encode(published, WeightsPublished(launch_version, "ab", 2)))
        writer.append(_frames(launch_version + 1))
        writer.close()
    reader = EventLogReader(tmp_path)
    assert newest_segment(tmp_path) == 2
    every = [e.event.message.version for e in reader.events_of({WeightsPublished.KIND})]
    assert every == [4, 7]
    assert [e.event.message.version for e in reader.events_of({WeightsPublished.KIND}, first_segment=2)] == [7]
    assert [e.event.message.step for e in reader.events_of({Metrics.KIND}, first_segment=2)] == [7, 8]
    assert newest_segment(tmp_path / "absent") == 0


def _offsets(directory: Path) -> list[int]:
    return [record.offset for record in EventLogReader(directory).records()]


def test_logger_records_both_channels_from_the_proxy(ctx: zmq.Context, proxy: BusAddresses, tmp_path: Path) -> None:
    events_dir = tmp_path / "events"
    logger = EventLogger(ctx, proxy, events_dir, segment_bytes=8192, flush_interval_s=0.05)
    logger.start()
    publishers = [Publisher(ctx, proxy, name) for name in ("router", "coordinator")]
    for publisher in publishers:
        wait_connected(publisher)
    for step in range(200):
        publishers[step % 2].publish(Metrics(step, {"x": 1.0}))
        if step % 50 == 0:
            publishers[1].publish(Pause(reason=f"step {step}"))
    batch = [Metrics(1000 + i, {}) for i in range(10)] + [Pause(reason="batched")]
    stamped = publishers[0].publish_many(batch)
    assert [e.seq for e in stamped] == [*range(101, 111), 1]  # the control event opens router/ctl's stream
    raw = make_socket(ctx, zmq.PUB, proxy.events_in)  # a peer sending junk through the proxy
    deadline = time.monotonic() + 20
    while logger.drops.total == 0 and time.monotonic() < deadline:  # until it has joined and junk arrived
        raw.send_multipart([b"obs.metrics", b"junk"])
        time.sleep(0.02)
    _wait_until(lambda: logger.writer.num_records == 206)  # the batch of 10 metrics is one record
    logger.stop()
    assert logger.drops.total >= 1
    reader = EventLogReader(events_dir)
    events = [logged.event for logged in reader.events()]
    assert len(events) == 215 and reader.problems == []
    assert sum(e.kind == "ctl.pause" for e in events) == 5
    router_seqs = [e.envelope.seq for e in events if e.envelope.sender == "router" and e.kind == "obs.metrics"]
    assert router_seqs == list(range(1, 111))
    assert logger.gaps.num_missing == 0
    raw.close(0)
    for publisher in publishers:
        publisher.close()


def _wait_until(condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def test_header_size_is_the_documented_24_bytes() -> None:
    assert HEADER.size == 24


def _full_disk(*_args: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_writer_that_fails_on_a_full_disk_is_reported_not_left_dead(
    ctx: zmq.Context, proxy: BusAddresses, tmp_path: Path
) -> None:
    logger = EventLogger(ctx, proxy, tmp_path / "events", flush_interval_s=0.05)
    logger.start()
    logger.check()  # a live writer: nothing to report
    logger.writer.flush = _full_disk  # type: ignore[method-assign]  # the next idle flush hits a full disk
    deadline = time.monotonic() + 30
    while logger.failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(EventLogFailedError, match="No space left on device"):
        logger.check()
    with pytest.raises(EventLogFailedError, match="No space left on device"):
        logger.stop()


def test_a_log_whose_last_records_cannot_be_written_fails_its_stop(
    ctx: zmq.Context, proxy: BusAddresses, tmp_path: Path
) -> None:
    logger = EventLogger(ctx, proxy, tmp_path / "events", flush_interval_s=0.05)
    logger.start()
    logger.writer.close = _full_disk  # type: ignore[method-assign]
    with pytest.raises(EventLogFailedError, match="No space left on device"):
        logger.stop()
    EventLogWriter.close(logger.writer)  # the segment the failed close left open
