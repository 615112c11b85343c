"""A PS shard under a storm of bad frames: every frame counted, a handful of log lines, still serving.
Peers of another PS protocol version are refused with a reason that names both versions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
import pytest
import zmq
from ps_helpers import Collector, ThreadShards, assert_same, small_model
from structlog.testing import capture_logs
from test_ps_sync import close, open_pair

from psrl.ps import Puller, PullFailedError
from psrl.ps.protocol import PROTOCOL_VERSION, ManifestReply, ManifestRequest, Unavailable, decode, encode

NUM_BAD = 500


def test_a_flood_of_bad_frames_is_counted_but_logged_sparsely(make_shards: Callable[..., ThreadShards]) -> None:
    shards = make_shards(1)
    server = shards.servers[0]
    ctx = zmq.Context()
    with capture_logs() as logs:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(shards.push_endpoints[0])
        for i in range(NUM_BAD):
            dealer.send(b"\xc1garbage" + i.to_bytes(4, "little"))
        deadline = time.monotonic() + 30
        while server.counters["dropped_malformed"] < NUM_BAD and time.monotonic() < deadline:
            time.sleep(0.02)
        dealer.close(linger=0)
    ctx.term()
    assert server.counters["dropped_malformed"] == NUM_BAD
    lines = [entry for entry in logs if entry["event"] == "ps.shard.dropped"]
    assert [line["count"] for line in lines] == [1, 10, 100]  # the 1st, 10th, 100th: not one per frame
    pusher, puller = open_pair(shards, "zmq")
    pusher.push(1, small_model(0))
    got = Collector()
    puller.pull(1, got)
    assert_same(got.tensors, small_model(0))
    close(pusher, puller)


def test_a_puller_of_another_protocol_version_is_refused_with_the_reason(
    make_shards: Callable[..., ThreadShards],
) -> None:
    shards = make_shards(1)
    pusher, puller = open_pair(shards, "zmq")
    pusher.push(1, small_model(0))
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(shards.pull_endpoints[0])
    dealer.send(encode(ManifestRequest(7, 1)))  # a puller from before protocol 2 sends no version
    assert dealer.poll(10_000)
    reply = decode(dealer.recv())
    dealer.close(linger=0)
    ctx.term()
    assert isinstance(reply, Unavailable) and reply.request_id == 7
    assert f"PS protocol 1, this shard {PROTOCOL_VERSION}" in reply.reason
    close(pusher, puller)


def test_a_shard_of_another_protocol_version_is_refused_with_the_reason(sockdir: str) -> None:
    ctx = zmq.Context()
    shard = ctx.socket(zmq.ROUTER)
    shard.bind(f"ipc://{sockdir}/old-shard")
    puller = Puller([f"ipc://{sockdir}/old-shard"], timeout_s=10)
    try:
        answered = threading.Thread(target=_answer_as_protocol_1, args=(shard,))
        answered.start()
        with pytest.raises(PullFailedError, match=f"speaks PS protocol 1, this puller {PROTOCOL_VERSION}"):
            puller.pull(1, Collector())
        answered.join(10)
    finally:
        puller.close()
        shard.close(linger=0)
        ctx.term()


def _answer_as_protocol_1(shard: zmq.Socket[bytes]) -> None:
    """A shard from before protocol 2: its manifest reply has no protocol field."""
    assert shard.poll(10_000)
    ident, frame = shard.recv_multipart()
    request = decode(frame)
    assert isinstance(request, ManifestRequest) and request.protocol == PROTOCOL_VERSION
    # tag, request id, version, digest, shards, entries, algorithm, entries, offer
    old_reply = msgspec.msgpack.encode(["manifest_reply", request.request_id, 1, b"d" * 16, 1, 0, "xxh3", [], b""])
    assert isinstance(decode(old_reply), ManifestReply)
    shard.send_multipart([ident, old_reply])
