"""Push and pull through real shard servers (threads of this process, real sockets), every transport."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import zmq
from ps_helpers import Collector, ThreadShards, assert_same, small_model, transport_params

from psrl.ps import LATEST, Puller, PullFailedError, Pusher, PushRefusedError
from psrl.ps.delta import HEADER_BYTES
from psrl.ps.protocol import PushBegin, encode
from psrl.ps.transports.zmq_frames import ZmqPushDataPlane

MakeShards = Callable[..., ThreadShards]
BLOCK = 16 << 10  # small blocks, so the embedding is split across shards


@pytest.fixture(params=transport_params())
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_OPENED: list[Pusher | Puller] = []


@pytest.fixture(autouse=True)
def _close_leftovers() -> Iterator[None]:
    """Close what a failing test left open (sockets would otherwise warn at garbage collection)."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def open_pair(shards: ThreadShards, transport: str, **puller_options: object) -> tuple[Pusher, Puller]:
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport=transport, max_block_bytes=BLOCK, timeout_s=30)
    puller = Puller(shards.pull_endpoints, transport=transport, timeout_s=10, **puller_options)  # type: ignore[arg-type]
    _OPENED.extend((pusher, puller))
    return pusher, puller


def close(*parts: Pusher | Puller) -> None:
    for part in parts:
        part.close()


class TestRoundTrip:
    def test_pull_returns_exactly_the_pushed_tensors(self, make_shards: MakeShards, transport: str) -> None:
        shards = make_shards(3, transport)
        pusher, puller = open_pair(shards, transport)
        model = small_model(0)
        pushed = pusher.push(1, model)
        got = Collector()
        result = puller.pull(1, got)
        assert_same(got.tensors, model)
        assert got.num_calls == len(model)  # split tensors are assembled and loaded once
        assert result.version == 1 and result.digest == pushed.digest and puller.held_version == 1
        assert result.num_bytes == result.num_bytes_total == pushed.num_bytes
        assert len({e.shard for e in pusher.plan_for(model).entries if e.name == "embed.weight"}) > 1
        close(pusher, puller)

    def test_previous_version_stays_readable_and_older_ones_retire(
        self, make_shards: MakeShards, transport: str
    ) -> None:
        shards = make_shards(2, transport)
        pusher, puller = open_pair(shards, transport)
        for version in (1, 2, 3):
            pusher.push(version, small_model(version))
        got = Collector()
        assert puller.pull(2, got).version == 2
        assert_same(got.tensors, small_model(2))
        with pytest.raises(PullFailedError, match="retired") as failure:
            puller.pull(1, Collector())
        assert failure.value.latest == 3
        result = puller.sync(got, version=1)
        assert result.version == 3 and result.num_attempts == 2
        assert_same(got.tensors, small_model(3))
        close(pusher, puller)

    def test_latest_resolves_to_the_newest_committed_version(self, make_shards: MakeShards, transport: str) -> None:
        shards = make_shards(2, transport)
        pusher, puller = open_pair(shards, transport)
        with pytest.raises(PullFailedError, match="no version"):
            puller.pull(LATEST, Collector())
        pusher.push(5, small_model(5))
        pusher.push(9, small_model(9))
        assert puller.latest_version() == 9
        got = Collector()
        assert puller.pull(LATEST, got).version == 9
        assert_same(got.tensors, small_model(9))
        close(pusher, puller)

    def test_shards_serve_the_rollout_dtype(self, make_shards: MakeShards, transport: str) -> None:
        shards = make_shards(2, transport, serve_dtype="bfloat16")
        pusher, puller = open_pair(shards, transport)
        model = small_model(1)
        pushed = pusher.push(1, model)
        got = Collector()
        result = puller.pull(1, got)
        cast = {n: (t.to(torch.bfloat16) if t.is_floating_point() else t) for n, t in model.items()}
        assert_same(got.tensors, cast)
        assert result.num_bytes_total < pushed.num_bytes
        widened = Puller(shards.pull_endpoints, transport=transport, load_dtype=torch.float32)
        got32 = Collector()
        widened.pull(1, got32)
        assert got32.tensors["layer.0.w"].dtype == torch.float32
        assert torch.equal(got32.tensors["layer.0.w"], cast["layer.0.w"].float())
        close(pusher, puller, widened)

    def test_stream_feeds_an_engine_style_loader(self, make_shards: MakeShards, transport: str) -> None:
        shards = make_shards(2, transport)
        pusher, puller = open_pair(shards, transport)
        model = small_model(4)
        pusher.push(1, model)
        engine = {n: torch.zeros_like(t) for n, t in model.items()}

        def load_weights(weights: object, version: int) -> None:
            for name, tensor in weights:  # type: ignore[attr-defined]
                engine[name].copy_(tensor)

        stream = puller.stream(1)
        load_weights(stream, 1)
        assert stream.result.version == 1
        assert_same(engine, model)
        close(pusher, puller)


class TestPublication:
    def test_shard_zero_commits_last(self, make_shards: MakeShards) -> None:
        shards = make_shards(3)
        pusher, puller = open_pair(shards, "zmq")
        for version in (1, 2):
            pusher.push(version, small_model(version))
        for version in (1, 2):
            order = [shard for shard, v in shards.commits if v == version]
            assert sorted(order) == [0, 1, 2] and order[-1] == 0
        close(pusher, puller)

    def test_hooks_report_stored_parts_then_the_announcement(self, make_shards: MakeShards) -> None:
        shards = make_shards(3)
        pusher, puller = open_pair(shards, "zmq")
        model = small_model(1)
        result = pusher.push(4, model)
        kinds = [(kind, event.shard) for kind, event in shards.events]
        assert sorted(kinds[:3]) == [("stored", 0), ("stored", 1), ("stored", 2)]  # all stored before any commit
        assert kinds[-1] == ("commit", 0)
        announcement = shards.events[-1][1]
        assert announcement.is_announcer and announcement.version == 4 and announcement.num_shards == 3
        assert announcement.digest == result.digest
        stored = {event.shard: event.num_bytes for kind, event in shards.events if kind == "stored"}
        assert [stored[i] for i in range(3)] == pusher.plan_for(model).shard_bytes()
        close(pusher, puller)

    def test_prepared_but_uncommitted_version_is_not_readable(self, make_shards: MakeShards, sockdir: str) -> None:
        shards = make_shards(1)
        pusher, puller = open_pair(shards, "zmq")
        pusher.push(1, small_model(1))
        manifest_entries = pusher.plan_for(small_model(2))
        assert manifest_entries.num_shards == 1
        # A bare begin for version 2 that is never committed.
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(shards.push_endpoints[0])
        dealer.send(encode(PushBegin(2, 1, 1, b"x", 1, 0, "xxh3_64", ())))
        assert dealer.poll(5000)
        dealer.recv()
        with pytest.raises(PullFailedError, match="not committed"):
            puller.pull(2, Collector())
        assert puller.latest_version() == 1
        dealer.close(0)
        ctx.term()
        close(pusher, puller)

    def test_stale_incarnation_and_old_versions_are_refused(self, make_shards: MakeShards) -> None:
        shards = make_shards(2)
        newer = Pusher(shards.push_endpoints, incarnation=7, max_block_bytes=BLOCK)
        older = Pusher(shards.push_endpoints, incarnation=6, max_block_bytes=BLOCK)
        newer.push(3, small_model(3))
        with pytest.raises(PushRefusedError, match="stale trainer incarnation") as stale:
            older.push(4, small_model(4))
        assert stale.value.max_incarnation == 7
        with pytest.raises(PushRefusedError, match="not newer"):
            newer.push(3, small_model(30))
        puller = Puller(shards.pull_endpoints)
        got = Collector()
        assert puller.pull(LATEST, got).version == 3
        assert_same(got.tensors, small_model(3))
        close(newer, older, puller)


def _embed_block_bytes(plan: object) -> int:
    return max(e.num_bytes for e in plan.entries if e.name == "embed.weight" and e.elem_start == 0)  # type: ignore[attr-defined]


class _CorruptFirstAttempt(ZmqPushDataPlane):
    """The outer edge of the test: flips one byte of every payload of a shard's first attempt."""

    def send(self, sock, begin, offer, payloads):  # type: ignore[no-untyped-def]
        if begin.attempt == 1 and payloads:
            entry, view = payloads[0]
            broken = bytearray(view)
            broken[0] ^= 0xFF
            payloads = [(entry, memoryview(broken)), *payloads[1:]]
        super().send(sock, begin, offer, payloads)


class TestIntegrity:
    def test_corrupted_push_is_retried_and_publishes_exact_bytes(self, make_shards: MakeShards) -> None:
        shards = make_shards(2)
        pusher, puller = open_pair(shards, "zmq")
        pusher._plane = _CorruptFirstAttempt()
        result = pusher.push(1, small_model(2))
        assert result.num_restarts == 2  # one retry per shard
        assert sum(s.counters["checksum_failures"] for s in shards.servers) == 2
        got = Collector()
        puller.pull(1, got)
        assert_same(got.tensors, small_model(2))
        close(pusher, puller)

    def test_corrupted_shard_storage_fails_the_pull(self, make_shards: MakeShards) -> None:
        shards = make_shards(1)
        pusher, puller = open_pair(shards, "zmq")
        pusher.push(1, small_model(0))
        held = shards.servers[0].versions.latest
        assert held is not None
        first = held.entries[0].index
        held.buffers.views[first][0] ^= 0xFF
        with pytest.raises(PullFailedError, match="checksum"):
            puller.pull(1, Collector())
        assert puller.held_version != 1
        close(pusher, puller)

    def test_malformed_frames_are_counted_and_dropped(self, make_shards: MakeShards) -> None:
        shards = make_shards(1)
        ctx = zmq.Context()
        for endpoint in (shards.push_endpoints[0], shards.pull_endpoints[0]):
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(endpoint)
            dealer.send(b"\xc1garbage")
            dealer.send_multipart([b"\x93\x01\x02", b"x", b"y"])
            dealer.close(linger=1000)
        ctx.term()
        pusher, puller = open_pair(shards, "zmq")
        pusher.push(1, small_model(0))
        got = Collector()
        puller.pull(1, got)
        assert_same(got.tensors, small_model(0))
        assert shards.servers[0].counters["dropped_malformed"] == 4
        close(pusher, puller)


class TestDeltaSync:
    def test_only_changed_entries_travel_and_reconstruction_is_exact(
        self, make_shards: MakeShards, transport: str
    ) -> None:
        shards = make_shards(2, transport)
        pusher, puller = open_pair(shards, transport, delta_sync=True)
        model = small_model(0)
        pusher.push(1, model)
        engine = Collector()
        first = puller.pull(1, engine)
        assert first.num_bytes == first.num_bytes_total
        model["layer.0.b"] += 1.0
        model["embed.weight"][0, 0] = 42.0  # one block of a split tensor
        pusher.push(2, model)
        loads = Collector()
        second = puller.pull(2, loads)
        plan = pusher.plan_for(model)
        changed_bytes = sum(e.num_bytes for e in plan.entries if e.name == "layer.0.b") + max(
            e.num_bytes for e in plan.entries if e.name == "embed.weight" and e.elem_start == 0
        )
        if transport == "zmq":  # the embedding block travels as one sparse change: header, skip 0, escape, value
            assert second.num_bytes == changed_bytes - _embed_block_bytes(plan) + HEADER_BYTES + 1 + 1 + 4
        else:
            assert second.num_bytes == changed_bytes
        assert second.num_bytes_saved == second.num_bytes_total - second.num_bytes
        assert set(loads.tensors) == {"layer.0.b", "embed.weight"}
        engine.tensors.update(loads.tensors)
        assert_same(engine.tensors, model)
        close(pusher, puller)

    def test_corrupted_mirror_is_detected_and_repaired(self, make_shards: MakeShards) -> None:
        shards = make_shards(2)
        pusher, puller = open_pair(shards, "zmq", delta_sync=True)
        model = small_model(0)
        pusher.push(1, model)
        engine = Collector()
        puller.pull(1, engine)
        assert puller.mirror is not None
        puller.mirror.tensor("layer.0.w")[0, 0] += 1.0
        model["norm.weight"] += 1
        pusher.push(2, model)
        with pytest.raises(PullFailedError, match="reconstruction"):
            puller.pull(2, engine)
        result = puller.pull(2, engine)
        assert result.version == 2
        assert_same(engine.tensors, model)
        close(pusher, puller)


class TestSparseDelta:
    def test_small_updates_travel_as_sparse_changes(self, make_shards: MakeShards) -> None:
        shards = make_shards(2, "zmq", serve_dtype="bfloat16")
        pusher, puller = open_pair(shards, "zmq", delta_sync=True)
        model = small_model(0)
        pusher.push(1, model)
        engine = Collector()
        puller.pull(1, engine)
        gen = torch.Generator().manual_seed(5)
        for name in ("embed.weight", "layer.0.w"):
            mask = torch.rand(model[name].shape, generator=gen) < 0.02
            model[name] += mask * 0.5
        pusher.push(2, model)
        loads = Collector()
        result = puller.pull(2, loads)
        engine.tensors.update(loads.tensors)
        served = {n: (t.to(torch.bfloat16) if t.is_floating_point() else t) for n, t in model.items()}
        assert_same(engine.tensors, served)
        assert 0 < result.num_bytes < 0.2 * result.num_bytes_total
        assert sum(s.counters["sparse_entries_encoded"] for s in shards.servers) > 0
        close(pusher, puller)

    def test_without_the_base_version_changed_entries_travel_whole(self, make_shards: MakeShards) -> None:
        shards = make_shards(2)
        pusher, puller = open_pair(shards, "zmq", delta_sync=True)
        model = small_model(0)
        pusher.push(1, model)
        engine = Collector()
        puller.pull(1, engine)
        for version in (2, 3):
            model["layer.0.w"][0, version] += 1.0
            pusher.push(version, model)
        entry_bytes = next(e.num_bytes for e in pusher.plan_for(model).entries if e.name == "layer.0.w")
        result = puller.pull(3, engine)  # the shards no longer hold version 1
        assert result.num_bytes == entry_bytes
        assert_same(engine.tensors, model)
        close(pusher, puller)
