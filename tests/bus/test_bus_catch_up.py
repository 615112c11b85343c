"""A restarted event logger catches up from the proxy's retainer: a logger SIGKILLed mid-run and
replaced later leaves a log with every event once, in order, as if it had never died."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import zmq
from bus_helpers import wait_connected

from bus.addresses import BusAddresses
from bus.codec import Encoder
from bus.eventlog import EventLogger, EventLogReader
from bus.messages import Metrics
from bus.publisher import Publisher
from bus.retainer import Retainer, message_key
from bus.schema import Envelope

HERE = Path(__file__).parent


def publish_steps(publisher: Publisher, steps: range) -> None:
    for step in steps:
        publisher.publish(Metrics(step, {"x": float(step)}))
        time.sleep(0.002)


def logged_steps(events_dir: Path) -> list[int]:
    return [logged.event.message.step for logged in EventLogReader(events_dir).events()]


def test_a_logger_killed_and_replaced_leaves_a_log_without_gaps(
    ctx: zmq.Context, proxy: BusAddresses, tmp_path: Path
) -> None:
    assert proxy.catch_up is not None
    proxy.save(tmp_path)
    events_dir = tmp_path / "events"
    first = subprocess.Popen(
        [sys.executable, str(HERE / "logger_proc.py"), str(tmp_path), str(events_dir)], stdout=subprocess.PIPE
    )
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == b"ready"
        publisher = Publisher(ctx, proxy, "trainer")
        wait_connected(publisher)
        publish_steps(publisher, range(1, 301))
        first.kill()  # records it buffered and never wrote are lost with it
        first.wait(10)
        publish_steps(publisher, range(301, 501))  # nobody logs these
        written = logged_steps(events_dir)
        assert written == list(range(1, len(written) + 1)) and len(written) < 500
        second = EventLogger(ctx, proxy, events_dir, flush_interval_s=0.05)
        second.start()
        deadline = time.monotonic() + 30
        while second.catch_up is None and time.monotonic() < deadline:
            time.sleep(0.05)
        publish_steps(publisher, range(501, 601))
        time.sleep(0.5)
        second.stop()
        publisher.close()
    finally:
        first.kill()
        first.wait(10)
        if first.stdout is not None:
            first.stdout.close()
    assert second.catch_up is not None and second.catch_up.anchor_found
    assert logged_steps(events_dir) == list(range(1, 601))
    assert second.gaps.num_missing == 0


def test_the_retainer_keeps_the_newest_messages_within_its_bounds(ctx: zmq.Context, tmp_path: Path) -> None:
    retainer = Retainer(ctx, f"ipc://{tmp_path}/retain.sock", max_messages=3)
    for step in range(1, 6):
        envelope = Envelope("obs.metrics", 1, "a", 0, step, step, step)
        retainer.keep(tuple(bytes(f) for f in Encoder().encode(envelope, Metrics(step, {}))))
    assert retainer.num_evicted == 2
    after, found = retainer.after(("a", 0, 3))
    assert found and [message_key(list(m)) for m in after] == [("a", 0, 4), ("a", 0, 5)]
    everything, found = retainer.after(("a", 0, 1))  # evicted: everything kept is newer
    assert not found and len(everything) == 3
