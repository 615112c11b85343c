"""KV transfer at real models' KV sizes, against raw ZeroMQ / NIXL moves of the same bytes (same run).

A source tier is filled directly with blocks of a model's KV geometry (the engine's block layout:
[layers, block tokens, 2 (K, V), KV heads, head dim], bf16, 16 tokens a block) for a context, in
one go as an engine exports a re-routed request's prefix, and a target fetches them all (sync)
over each channel into its own tier, kept from one repeat to the next (cleared in between: a
running instance's tier is warm). The raw baselines move the same bytes between buffers that are
reused (warm) too and lie in the same memory as the tiers' (huge pages where the kernel grants
them, psrl.kvcache.host_buffer: they speed NIXL's copies up as much as the tier's): ZeroMQ in one
message, in messages of a fetch's first piece (16 blocks) and in messages of its largest piece
(16 MiB) received into their places in one buffer (the best of the three counts), NIXL in one
write. Every round takes one
fetch per channel and one of each raw move in turn, so both sides see the same load; medians over
the rounds after a warm-up round. Used by tools/bench_kv.py; runs on its own too:

    .venv-kv/bin/python tools/bench_kv_transfer.py
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.engine.kv_offload import make_tier
from psrl.kvcache.host_buffer import huge_page_buffer
from psrl.kvcache.tier import KvTier
from psrl.kvcache.transfer import KvFetcher, KvServer
from psrl.kvcache.transfer.client import MAX_TCP_PIECE_BYTES, PIECE_BLOCKS
from psrl.kvcache.transfer.nixl_channel import NixlLanding, NixlWriter
from psrl.kvcache.transfer.wire import FetchRequest

BLOCK_TOKENS = 16
GEOMETRIES = {"Qwen2.5-0.5B": (24, 2, 64), "Qwen2.5-7B": (28, 4, 128)}  # layers, KV heads, head dim
CONTEXTS = (1024, 4096)
CHANNELS = ("tcp", "nixl")


def filled_tier(shape: tuple[int, ...], num_blocks: int, capacity: int) -> tuple[KvTier, list[tuple[int, int]]]:
    """A source tier holding a context's blocks, stored together as an engine exports a request's
    prefix for a re-route (psrl.engine.kv_offload.EngineOffload.offload_blocks)."""
    tier = make_tier(capacity, shape, torch.bfloat16, "LRU")
    keys = [(3, 7_000_000 + i) for i in range(num_blocks)]  # weight version 3, chained hashes
    tokens = [tuple(range(i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS)) for i in range(num_blocks)]
    assert tier.put_many(keys, tokens, torch.randn((num_blocks, *shape)).to(torch.bfloat16)) == num_blocks
    return tier, keys


def fetch_moves(server: KvServer, target: KvTier, keys: list[tuple[int, int]], channel: str) -> Iterator[float]:
    """GB/s of a whole sync fetch of ``keys`` into ``target`` (emptied before each), one per ``next``
    (``awaited``: the target waits for all of it, as in sync mode)."""
    fetcher = KvFetcher(target, channel)  # type: ignore[arg-type]
    fetcher.fetch("warm", server.address, [], 30)
    try:
        for repeat in itertools.count():
            target.clear()
            outcome = fetcher.fetch(f"{channel}{repeat}", server.address, keys, 60, awaited=True)
            assert outcome.error == "" and outcome.num_blocks == len(keys), outcome
            yield outcome.num_bytes / outcome.seconds / 1e9
    finally:
        fetcher.close()
        fetcher.join(10.0)


def same_blocks(source: KvTier, target: KvTier, keys: list[tuple[int, int]]) -> bool:
    for key in (keys[0], keys[len(keys) // 2], keys[-1]):
        mine, theirs = source.read(key), target.read(key)
        if mine is None or theirs is None or mine[0] != theirs[0] or not torch.equal(mine[1], theirs[1]):
            return False
    return True


def raw_tcp_moves(num_bytes: int, message_bytes: int, into: bool = False) -> Iterator[float]:
    """GB/s of ``num_bytes`` in ZeroMQ messages of ``message_bytes`` from a PUSH to a PULL socket,
    sent back to back until the last is received, one per ``next``; ``into``: each received into
    its place in one warm buffer (``recv_into``, as a fetch lands its pieces) instead of a message
    of ZeroMQ's own. The two sockets have a ZeroMQ context (an I/O thread) each, as two processes
    would, and as the source's server and the target's fetcher do."""
    payload = huge_page_buffer(num_bytes)
    payload.copy_(torch.randint(0, 255, (num_bytes,), dtype=torch.uint8))
    messages = [payload[i : i + message_bytes].numpy() for i in range(0, num_bytes, message_bytes)]
    landing = huge_page_buffer(num_bytes).numpy() if into else None
    receiving, sending = zmq.Context(), zmq.Context()
    pull, push = receiving.socket(zmq.PULL), sending.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        while True:
            started = time.perf_counter()
            for message in messages:
                push.send(message, copy=False)
            for offset in range(0, num_bytes, message_bytes):
                if landing is None:
                    pull.recv(copy=False)
                else:
                    pull.recv_into(landing[offset:])
            yield num_bytes / (time.perf_counter() - started) / 1e9
    finally:
        push.close(0)
        pull.close(0)
        receiving.term()
        sending.term()


def raw_nixl_moves(num_bytes: int) -> Iterator[float]:
    """GB/s of one NIXL WRITE of ``num_bytes`` from a registered buffer into a registered one, one per ``next``."""
    target = huge_page_buffer(num_bytes)
    landing, writer = NixlLanding([target]), NixlWriter("raw")
    region = [(target.data_ptr(), num_bytes)]
    request = FetchRequest("raw", [], "nixl", "", landing.agent.name, landing.metadata, region)
    writer.stage(num_bytes).copy_(torch.randint(0, 255, (num_bytes,), dtype=torch.uint8))
    try:
        while True:
            started = time.perf_counter()
            writer.write_staged(num_bytes, request)
            yield num_bytes / (time.perf_counter() - started) / 1e9
    finally:
        landing.close()
        writer.close()


def interleaved(moves: dict[str, Iterator[float]], repeats: int) -> dict[str, float]:
    """Median GB/s of each kind of move over ``repeats`` rounds that take one of each in turn (after
    one warm-up round), so that every kind sees the same load on the shared cores. Each round
    starts one kind later than the one before: whichever move follows a large raw write runs up
    to 10% slower (measured), and no kind should always be the one that follows it."""
    rates: dict[str, list[float]] = {name: [] for name in moves}
    names = list(moves)
    try:
        for round_ in range(repeats + 1):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                rate = next(moves[name])
                if round_:
                    rates[name].append(rate)
    finally:
        for move in moves.values():
            move.close()  # type: ignore[attr-defined]
    return {name: statistics.median(values) for name, values in rates.items()}


RAW_TCP = ("raw_tcp_one", "raw_tcp_pieces", "raw_tcp_into")


def raw_moves(num_bytes: int, message_bytes: int) -> dict[str, Iterator[float]]:
    """Raw ZeroMQ in one message, in messages of a fetch's first piece (``message_bytes``) and in
    messages of its largest piece received into one buffer (the best of the three counts); raw
    NIXL in one write."""
    return {
        "raw_tcp_one": raw_tcp_moves(num_bytes, num_bytes),
        "raw_tcp_pieces": raw_tcp_moves(num_bytes, message_bytes),
        "raw_tcp_into": raw_tcp_moves(num_bytes, min(num_bytes, MAX_TCP_PIECE_BYTES), into=True),
        "raw_nixl": raw_nixl_moves(num_bytes),
    }


def raw_rates(num_bytes: int, repeats: int, message_bytes: int) -> tuple[float, float]:
    """Median GB/s of raw ZeroMQ (the best of ``RAW_TCP``, messages of ``message_bytes``) and of one
    raw NIXL write, of ``num_bytes``."""
    rates = interleaved(raw_moves(num_bytes, message_bytes), repeats)
    return max(rates[name] for name in RAW_TCP), rates["raw_nixl"]


def one_size(model: str, tokens: int, repeats: int) -> dict[str, float]:
    layers, heads, head_dim = GEOMETRIES[model]
    shape = (layers, BLOCK_TOKENS, 2, heads, head_dim)
    num_blocks = tokens // BLOCK_TOKENS
    block_bytes = torch.Size(shape).numel() * 2
    capacity = num_blocks * block_bytes
    source, keys = filled_tier(shape, num_blocks, capacity)
    targets = {channel: make_tier(2 * capacity, shape, torch.bfloat16, "LRU") for channel in CHANNELS}
    server = KvServer(source)
    moves = {f"fetch_{channel}": fetch_moves(server, targets[channel], keys, channel) for channel in CHANNELS}
    rates = interleaved({**moves, **raw_moves(capacity, PIECE_BLOCKS * block_bytes)}, repeats)
    server.close()
    for channel in CHANNELS:
        assert same_blocks(source, targets[channel], keys), f"{model} {tokens}: {channel} landed other bytes"
    row: dict[str, float] = {"mib": capacity / 2**20, "block_kib": block_bytes / 1024}
    row["raw_tcp_gbps"] = max(rates[name] for name in RAW_TCP)
    row["raw_nixl_gbps"] = rates["raw_nixl"]
    for channel in CHANNELS:
        row[f"fetch_{channel}_gbps"] = rates[f"fetch_{channel}"]
        row[f"{channel}_vs_raw"] = row[f"fetch_{channel}_gbps"] / row[f"raw_{channel}_gbps"]
    return row


def transfer_table(repeats: int) -> dict[str, dict[str, float]]:
    table = {}
    for model in GEOMETRIES:
        for tokens in CONTEXTS:
            table[f"{model} {tokens // 1024}k"] = row = one_size(model, tokens, repeats)
            print(f"transfer  {model} {tokens // 1024}k: " + ", ".join(f"{k}={v:.3g}" for k, v in row.items()),
                  flush=True)  # fmt: skip
    return table


def best_vs_raw(table: dict[str, dict[str, float]]) -> float:
    """The median over sizes of the better channel's fetch / raw ratio."""
    return statistics.median(max(row[f"{channel}_vs_raw"] for channel in CHANNELS) for row in table.values())


def transfer_fields(table: dict[str, dict[str, float]]) -> str:
    """RESULT fields: ``transfer_vs_raw`` (``best_vs_raw``), then per channel the median over sizes
    of its fetch / raw ratio and of its fetch GB/s (the better ratio is not always the faster channel)."""
    fields = {"transfer_vs_raw": best_vs_raw(table)}
    for channel in CHANNELS:
        fields[f"{channel}_vs_raw"] = statistics.median(row[f"{channel}_vs_raw"] for row in table.values())
        fields[f"{channel}_gbps"] = statistics.median(row[f"fetch_{channel}_gbps"] for row in table.values())
    return " ".join(f"{name}={value:.3f}" for name, value in fields.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = transfer_table(args.repeats)
    print(f"RESULT {transfer_fields(table)}")


if __name__ == "__main__":
    main()
