"""Property: across random push/pull interleavings with several readers, every completed pull equals
exactly one published version (no mixing, nothing unpublished)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ps_helpers import Collector, ThreadShards, small_model

from psrl.ps import LATEST, Puller, PullFailedError, Pusher

NUM_READERS = 3


@dataclass(frozen=True)
class Push:
    pause_s: float


@dataclass(frozen=True)
class Pull:
    reader: int
    target: str  # "latest", "previous", "sync" or "any"
    load_delay_s: float
    pause_s: float


@dataclass
class Outcome:
    completed: list[tuple[int, dict[str, torch.Tensor]]] = field(default_factory=list)
    num_failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


operations = st.lists(
    st.one_of(
        st.builds(Push, pause_s=st.sampled_from([0.0, 0.002, 0.01])),
        st.builds(
            Pull,
            reader=st.integers(0, NUM_READERS - 1),
            target=st.sampled_from(["latest", "previous", "sync", "any"]),
            load_delay_s=st.sampled_from([0.0, 0.0005, 0.002]),
            pause_s=st.sampled_from([0.0, 0.002]),
        ),
    ),
    min_size=2,
    max_size=14,
)


class _SlowCollector(Collector):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def __call__(self, name: str, tensor: torch.Tensor) -> None:
        super().__call__(name, tensor)
        time.sleep(self.delay_s)


def _reader(puller: Puller, jobs: queue.SimpleQueue[Pull | None], outcome: Outcome, newest: Callable[[], int]) -> None:
    while (job := jobs.get()) is not None:
        collector = _SlowCollector(job.load_delay_s)
        try:
            if job.target == "sync":
                result = puller.sync(collector, max_attempts=3)
            else:
                target = {"latest": LATEST, "previous": newest() - 1, "any": max(1, newest() // 2)}[job.target]
                result = puller.pull(target, collector)
        except PullFailedError:
            with outcome.lock:
                outcome.num_failed += 1
            continue
        with outcome.lock:
            outcome.completed.append((result.version, collector.tensors))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_every_completed_pull_is_exactly_one_published_version(sockdir: str, ops: list[Push | Pull]) -> None:
    shards = ThreadShards(sockdir, 2)
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=8 << 10, timeout_s=30)
    pullers = [Puller(shards.pull_endpoints, timeout_s=10) for _ in range(NUM_READERS)]
    outcome = Outcome()
    pushed: list[int] = []
    pusher.push(1, small_model(1))
    pushed.append(1)
    jobs: list[queue.SimpleQueue[Pull | None]] = [queue.SimpleQueue() for _ in range(NUM_READERS)]
    readers = [
        threading.Thread(target=_reader, args=(pullers[i], jobs[i], outcome, lambda: pushed[-1]))
        for i in range(NUM_READERS)
    ]
    for thread in readers:
        thread.start()
    try:
        for op in ops:
            if isinstance(op, Push):
                version = pushed[-1] + 1
                pusher.push(version, small_model(version))
                pushed.append(version)
            else:
                jobs[op.reader].put(op)
            time.sleep(op.pause_s)
    finally:
        for q in jobs:
            q.put(None)
        for thread in readers:
            thread.join(60)
        for part in (pusher, *pullers):
            part.close()
        shards.stop()
    published = {v for shard, v in shards.commits if shard == 0}
    for version, tensors in outcome.completed:
        assert version in published
        expected = small_model(version)
        assert set(tensors) == set(expected)
        for name, tensor in expected.items():
            assert torch.equal(tensors[name], tensor), (version, name)
    # Commit order: shard 0 announces a version only after every other shard committed it.
    for version in published:
        order = [shard for shard, v in shards.commits if v == version]
        assert order[-1] == 0 and sorted(order) == [0, 1]
