"""The puller's mirror under delta sync: a sparse delta only ever lands on the base version's bytes.

An entry is forgotten before it is written and held again only once verified, and only entries
held exactly as in the last version the mirror held whole may come sparse. So after a pull that
rewrote an entry and then failed, the next pull fetches that entry whole.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from ps_helpers import Collector, ThreadShards, assert_same, small_model

from psrl.ps import Puller, PullFailedError, Pusher
from psrl.ps.manifest import ManifestEntry
from psrl.ps.mirror import Mirror
from psrl.ps.protocol import PullChunk
from psrl.ps.transports.base import Replier
from psrl.ps.versions import NONE


def _entry(index: int, checksum: int, name: str = "w") -> ManifestEntry:
    return ManifestEntry(index, name, (4,), "float32", 0, 0, 4, 0, 16, checksum)


def _held(mirror: Mirror, *entries: ManifestEntry) -> None:
    mirror.prepare(entries)
    for entry in entries:
        mirror.destination(entry)
        mirror.landed(entry)


class TestBase:
    def test_no_base_before_a_whole_version_was_settled(self) -> None:
        mirror = Mirror()
        a = _entry(0, 1)
        _held(mirror, a)
        assert mirror.base_for([_entry(0, 2)]) == (NONE, ())

    def test_entries_held_as_in_the_base_may_come_sparse(self) -> None:
        mirror = Mirror()
        a, b = _entry(0, 1, "a"), _entry(1, 1, "b")
        _held(mirror, a, b)
        mirror.settle(7, [a, b])
        assert mirror.base_for([_entry(0, 2, "a"), _entry(1, 2, "b")]) == (7, (0, 1))

    def test_an_entry_being_written_is_no_longer_the_base(self) -> None:
        mirror = Mirror()
        a, b = _entry(0, 1, "a"), _entry(1, 1, "b")
        _held(mirror, a, b)
        mirror.settle(7, [a, b])
        mirror.destination(_entry(0, 2, "a"))  # a pull starts writing a's new bytes, then fails
        assert mirror.base_for([_entry(0, 3, "a"), _entry(1, 3, "b")]) == (7, (1,))
        mirror.landed(_entry(0, 2, "a"))  # verified bytes of another version: not the base either
        assert not mirror.holds_base(_entry(0, 3, "a"))
        mirror.landed(a)  # the base's own bytes again (the same checksum)
        assert mirror.holds_base(_entry(0, 3, "a"))

    def test_a_new_layout_is_never_the_base(self) -> None:
        mirror = Mirror()
        a = _entry(0, 1, "a")
        _held(mirror, a)
        mirror.settle(7, [a])
        moved = ManifestEntry(0, "a", (2, 2), "float32", 0, 0, 4, 0, 16, 2)
        assert not mirror.holds_base(moved)
        mirror.prepare([moved])  # re-allocated: nothing of it is held
        assert mirror.base_for([moved]) == (NONE, ())


class _GarbleNextPull:
    """A fault on the wire: the next entries a shard serves go out whole, with every byte flipped."""

    def __init__(self, shards: ThreadShards) -> None:
        self.plane = shards.servers[0]._plane
        self._serve = self.plane.serve
        self.plane.serve = self._garbled  # type: ignore[method-assign]
        self.num_garbled = 0

    def _garbled(self, reply: Replier, request: object, entries: object, buffers: object, sparse: object) -> None:
        def flipped(message: object, payload: memoryview | None) -> object:
            if isinstance(message, PullChunk) and payload is not None:
                self.num_garbled += 1
                payload = memoryview(np.frombuffer(payload, dtype=np.uint8) ^ 0xFF)
            return reply(message, payload)  # type: ignore[arg-type]

        self.plane.serve = self._serve  # type: ignore[method-assign]
        self._serve(flipped, request, entries, buffers, None)  # type: ignore[arg-type]


def test_an_entry_a_failed_pull_rewrote_comes_whole_next_time(make_shards: Callable[..., ThreadShards]) -> None:
    shards = make_shards(1, "zmq", serve_dtype="bfloat16")
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=16 << 10, timeout_s=30)
    puller = Puller(shards.pull_endpoints, delta_sync=True, timeout_s=10)
    try:
        model = small_model(0)
        pusher.push(1, model)
        engine = Collector()
        puller.pull(1, engine)
        model["layer.0.w"][0, :3] += 0.5  # a small change: served as a sparse delta from version 1
        pusher.push(2, model)
        fault = _GarbleNextPull(shards)
        with pytest.raises(PullFailedError, match="checksum"):
            puller.pull(2, engine)  # layer.0.w's garbled bytes were written into the mirror
        assert fault.num_garbled == 1
        assert puller.held_version == 1  # the engine was handed nothing: it still holds version 1
        result = puller.pull(2, engine)
        entry = next(e for e in pusher.plan_for(model).entries if e.name == "layer.0.w")
        assert result.num_bytes == entry.num_elems * 2  # whole, in bf16: no delta on the garbled bytes
        served = {n: (t.to(torch.bfloat16) if t.is_floating_point() else t) for n, t in model.items()}
        assert_same(engine.tensors, served)
        model["layer.0.w"][1, :3] += 0.5
        pusher.push(3, model)
        assert puller.pull(3, engine).num_bytes < entry.num_elems * 2  # sparse again, from version 2
    finally:
        pusher.close()
        puller.close()
