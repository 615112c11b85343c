"""KV transfer between two real tiers (LMCache's CPU backend) over real sockets, piece by piece.

A fetch asks for several pieces at once over a connection it keeps; these tests pin down what that
must not change: blocks land in prefix order and stop at the first gap, a source that stops
answering mid-fetch leaves an outcome with an error and every block that had landed, and a kept
connection to a source that went away fails cleanly or reaches the new source.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import zmq

pytest.importorskip("lmcache", reason="needs the kv extra: pip install -c constraints.txt -e '.[kv]'")
pytestmark = pytest.mark.kv

from psrl.engine.kv_offload import make_tier  # noqa: E402
from psrl.kvcache.tier import KvTier  # noqa: E402
from psrl.kvcache.transfer import KvFetcher, KvServer  # noqa: E402

PADDED = (2, 4, 2, 1, 8)  # 512 bytes: LMCache pads each to 4 KiB, so a piece goes block by block
ADJACENT = (2, 16, 2, 2, 16)  # 8 KiB: whole pieces are adjacent in the buffer
NUM_BLOCKS = 13


def tier_of(shape: tuple[int, ...]) -> KvTier:
    return make_tier(64 * torch.Size(shape).numel() * 4, shape, torch.float32, "LRU")


def keys_of(count: int) -> list[tuple[int, int]]:
    return [(2, 500 + i) for i in range(count)]


def tokens_of(index: int) -> tuple[int, ...]:
    return (index, index + 1, index + 2)


def filled(shape: tuple[int, ...], skip: int | None = None) -> KvTier:
    tier = tier_of(shape)
    for index, key in enumerate(keys_of(NUM_BLOCKS)):
        if index != skip:
            assert tier.put(key, tokens_of(index), torch.full(shape, float(index)))
    return tier


def assert_landed(target: KvTier, count: int, shape: tuple[int, ...]) -> None:
    """The first ``count`` blocks, with their tokens and bytes, in prefix order; nothing else."""
    assert target.drain_changes().added == keys_of(count)  # admitted in this order
    out = torch.empty(shape)
    for index, key in enumerate(keys_of(count)):
        assert target.get_into(key, tokens_of(index), out) and torch.equal(out, torch.full(shape, float(index)))
    assert len(target) == count


def channels() -> list[str]:
    try:
        import nixl  # noqa: F401
    except ImportError:
        return ["tcp"]
    return ["tcp", "nixl"]


@pytest.fixture
def fetchers() -> Iterator[list[KvFetcher]]:
    made: list[KvFetcher] = []
    yield made
    for fetcher in made:
        fetcher.close()
        assert fetcher.join(30.0)


@pytest.mark.parametrize("channel", channels())
@pytest.mark.parametrize("shape", [PADDED, ADJACENT])
def test_pipelined_pieces_land_in_prefix_order_over_one_kept_connection(
    channel: str, shape: tuple[int, ...], fetchers: list[KvFetcher]
) -> None:
    server = KvServer(filled(shape))
    target = tier_of(shape)
    fetcher = KvFetcher(target, channel, piece_blocks=2, pieces_in_flight=3)  # type: ignore[arg-type]
    fetchers.append(fetcher)
    try:
        for attempt in range(2):
            target.clear()
            target.drain_changes()
            outcome = fetcher.fetch(f"t{attempt}", server.address, keys_of(NUM_BLOCKS), 30)
            assert outcome.error == "" and outcome.num_blocks == NUM_BLOCKS
            assert outcome.num_bytes == NUM_BLOCKS * torch.Size(shape).numel() * 4
            assert_landed(target, NUM_BLOCKS, shape)
        assert fetcher.connections.num_opened == 1
        assert fetcher.num_abandoned_blocks == 0
    finally:
        server.close()


@pytest.mark.parametrize("channel", channels())
def test_a_gap_ends_the_fetch_and_what_was_asked_past_it_is_dropped(channel: str, fetchers: list[KvFetcher]) -> None:
    """Block 5 is missing at the source: blocks 0-4 land, none after (the source still holds them),
    and the replies to the pieces asked past the gap do not confuse the next fetch on the connection."""
    source = filled(ADJACENT, skip=5)
    server = KvServer(source)
    target = tier_of(ADJACENT)
    fetcher = KvFetcher(target, channel, piece_blocks=2, pieces_in_flight=3)  # type: ignore[arg-type]
    fetchers.append(fetcher)
    try:
        outcome = fetcher.fetch("gap", server.address, keys_of(NUM_BLOCKS), 30)
        assert outcome.error == "" and outcome.num_blocks == 5
        assert_landed(target, 5, ADJACENT)
        source.put(keys_of(NUM_BLOCKS)[5], tokens_of(5), torch.full(ADJACENT, 5.0))
        target.clear()
        target.drain_changes()
        again = fetcher.fetch("whole", server.address, keys_of(NUM_BLOCKS), 30)
        assert again.error == "" and again.num_blocks == NUM_BLOCKS
        assert_landed(target, NUM_BLOCKS, ADJACENT)
        assert fetcher.connections.num_opened == 1 and fetcher.num_abandoned_blocks == 0
    finally:
        server.close()


class Relay:
    """A source's address that forwards the first ``answers`` requests to the real server and then
    goes silent (a source dying mid-fetch, as the target sees it)."""

    def __init__(self, upstream: str, answers: int) -> None:
        self._context = zmq.Context()
        self._front = self._context.socket(zmq.ROUTER)
        self._front.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self._front.bind_to_random_port('tcp://127.0.0.1')}"
        self._back = self._context.socket(zmq.DEALER)
        self._back.setsockopt(zmq.LINGER, 0)
        self._back.connect(upstream)
        self._answers = answers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        identities: list[Any] = []
        poller = zmq.Poller()
        poller.register(self._front, zmq.POLLIN)
        poller.register(self._back, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(20))
            if self._front in ready:
                identity, *frames = self._front.recv_multipart()
                if self._answers > 0:
                    self._answers -= 1
                    identities.append(identity)
                    self._back.send_multipart(frames)
            if self._back in ready:
                self._front.send_multipart([identities.pop(0), *self._back.recv_multipart()])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._front.close(0)
        self._back.close(0)
        self._context.term()


@pytest.mark.parametrize("channel", channels())
def test_a_source_dying_mid_fetch_leaves_an_error_and_every_block_that_landed(
    channel: str, fetchers: list[KvFetcher]
) -> None:
    server = KvServer(filled(ADJACENT))
    relay = Relay(server.address, answers=3)  # pieces 0-2 (6 blocks) are answered, then silence
    target = tier_of(ADJACENT)
    fetcher = KvFetcher(target, channel, piece_blocks=2, pieces_in_flight=2, max_piece_blocks=2)  # type: ignore[arg-type]
    fetchers.append(fetcher)
    try:
        fetcher.fetch("warm", server.address, [], 30)  # NIXL: the source knows the target before the relay
        outcome = fetcher.fetch("dies", relay.address, keys_of(NUM_BLOCKS), 1.0)
        assert "TimeoutError" in outcome.error and outcome.num_blocks == 6
        assert_landed(target, 6, ADJACENT)
        if channel == "nixl":  # the 2 pieces asked and never answered: their room is never reused
            assert fetcher.num_abandoned_blocks == 4
        target.clear()
        target.drain_changes()
        whole = fetcher.fetch("direct", server.address, keys_of(NUM_BLOCKS), 30)
        assert whole.error == "" and whole.num_blocks == NUM_BLOCKS
        assert_landed(target, NUM_BLOCKS, ADJACENT)
    finally:
        relay.close()
        server.close()


@pytest.mark.parametrize("channel", channels())
def test_a_kept_connection_reaches_a_source_restarted_at_its_address_and_fails_cleanly_at_a_dead_one(
    channel: str, fetchers: list[KvFetcher]
) -> None:
    source = filled(ADJACENT)
    first = KvServer(source)
    port = int(first.address.rsplit(":", 1)[1])
    target = tier_of(ADJACENT)
    fetcher = KvFetcher(target, channel, piece_blocks=4)  # type: ignore[arg-type]
    fetchers.append(fetcher)
    assert fetcher.fetch("before", first.address, keys_of(NUM_BLOCKS), 30).num_blocks == NUM_BLOCKS
    first.close()
    dead = fetcher.fetch("dead", first.address, keys_of(NUM_BLOCKS), 1.0)
    assert "TimeoutError" in dead.error and dead.num_blocks == 0  # the tier already holds them all: none new
    restarted = KvServer(source, port=port)
    moved = KvServer(source)
    try:
        for server in (restarted, moved):
            target.clear()
            target.drain_changes()
            outcome = fetcher.fetch("after", server.address, keys_of(NUM_BLOCKS), 30)
            assert outcome.error == "" and outcome.num_blocks == NUM_BLOCKS
            assert_landed(target, NUM_BLOCKS, ADJACENT)
        assert fetcher.connections.num_opened == 3  # the failed fetch's connection was not kept
    finally:
        restarted.close()
        moved.close()


@pytest.mark.parametrize("channel", channels())
def test_a_target_tier_with_no_room_takes_nothing_and_keeps_nothing(channel: str, fetchers: list[KvFetcher]) -> None:
    """Everything in the target's tier is pinned: nothing lands (ZeroMQ: the tier refuses each
    block; NIXL: no room can be reserved to write into, an error), fetch after fetch, and no room
    is left held (more fetches than LMCache's buffer holds blocks)."""
    server = KvServer(filled(ADJACENT))
    block_bytes = torch.Size(ADJACENT).numel() * 4
    target = make_tier(2 * block_bytes, ADJACENT, torch.float32, "LRU")
    pinned = [(9, 1), (9, 2)]
    for key in pinned:
        assert target.put(key, (0,), torch.zeros(ADJACENT))
    assert target.pin("p", pinned) == 2
    fetcher = KvFetcher(target, channel, piece_blocks=4)  # type: ignore[arg-type]
    fetchers.append(fetcher)
    try:
        for attempt in range(20):
            outcome = fetcher.fetch(f"full{attempt}", server.address, keys_of(NUM_BLOCKS), 30)
            assert outcome.num_blocks == 0
            assert outcome.error == "" if channel == "tcp" else "no room" in outcome.error
        assert target.keys() == pinned and target.index.reserved_bytes == 0
    finally:
        server.close()


@pytest.mark.parametrize("channel", channels())
def test_a_full_target_tier_makes_room_for_a_fetch(channel: str, fetchers: list[KvFetcher]) -> None:
    """A target tier full of other (unpinned) blocks evicts them for the fetched ones, NIXL's
    reservations included: every block lands, the tier never holds more than its capacity."""
    server = KvServer(filled(ADJACENT))
    block_bytes = torch.Size(ADJACENT).numel() * 4
    target = make_tier(8 * block_bytes, ADJACENT, torch.float32, "LRU")
    for index in range(8):
        assert target.put((9, index), (index,), torch.zeros(ADJACENT))
    fetcher = KvFetcher(target, channel, piece_blocks=2, pieces_in_flight=2)  # type: ignore[arg-type]
    fetchers.append(fetcher)
    try:
        for attempt in range(3):
            outcome = fetcher.fetch(f"evicting{attempt}", server.address, keys_of(NUM_BLOCKS), 30)
            assert outcome.error == "" and outcome.num_blocks == NUM_BLOCKS
            assert target.keys() == keys_of(NUM_BLOCKS)[-8:] and target.used_bytes == 8 * block_bytes
            assert target.index.reserved_bytes == 0
            target.clear()
            for index in range(8):
                assert target.put((9, index), (index,), torch.zeros(ADJACENT))
    finally:
        server.close()


@pytest.mark.parametrize("channel", channels())
def test_an_awaited_fetch_asks_in_pieces_as_long_as_allowed_and_lands_everything(
    channel: str, fetchers: list[KvFetcher]
) -> None:
    """Sync and pin_sync wait for the whole fetch: no short leading piece, the same blocks in order."""
    server = KvServer(filled(ADJACENT))
    target = tier_of(ADJACENT)
    fetcher = KvFetcher(target, channel, piece_blocks=2, max_piece_blocks=4)  # type: ignore[arg-type]
    fetchers.append(fetcher)
    try:
        assert [len(piece) for piece in fetcher.plan(keys_of(NUM_BLOCKS), awaited=True)] == [4, 4, 4, 1]
        assert [len(piece) for piece in fetcher.plan(keys_of(NUM_BLOCKS))] == [2, 4, 4, 3]
        outcome = fetcher.fetch("awaited", server.address, keys_of(NUM_BLOCKS), 30, awaited=True)
        assert outcome.error == "" and outcome.num_blocks == NUM_BLOCKS
        assert_landed(target, NUM_BLOCKS, ADJACENT)
    finally:
        server.close()
