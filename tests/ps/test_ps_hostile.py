"""A PS shard under a storm of bad frames: every frame counted, a handful of log lines, still serving."""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq
from ps_helpers import Collector, ThreadShards, assert_same, small_model
from structlog.testing import capture_logs
from test_ps_sync import close, open_pair

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
