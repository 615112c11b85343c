"""KV transfer at real models' KV sizes, against raw ZeroMQ / NIXL moves of the same bytes (same run).

A source tier is filled directly with blocks of a model's KV geometry (the engine's block layout:
[layers, block tokens, 2 (K, V), KV heads, head dim], bf16, 16 tokens a block) for a context, and a
target fetches them all (sync) over each channel into its own tier, kept from one repeat to the next
(cleared in between: a running instance's tier is warm). The raw baselines move the same bytes in
one ZeroMQ message / one NIXL write between buffers that are reused (warm) too. Repeats after a
warm-up; medians of both sides. Used by tools/bench_kv.py; runs on its own too:

    .venv-kv/bin/python tools/bench_kv_transfer.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.engine.kv_offload import make_tier
from psrl.kvcache.tier import KvTier
from psrl.kvcache.transfer import KvFetcher, KvServer
from psrl.kvcache.transfer.client import PIECE_BLOCKS
from psrl.kvcache.transfer.nixl_channel import NixlLanding, NixlWriter
from psrl.kvcache.transfer.wire import FetchRequest

BLOCK_TOKENS = 16
GEOMETRIES = {"Qwen2.5-0.5B": (24, 2, 64), "Qwen2.5-7B": (28, 4, 128)}  # layers, KV heads, head dim
CONTEXTS = (1024, 4096)
CHANNELS = ("tcp", "nixl")


def filled_tier(shape: tuple[int, ...], num_blocks: int, capacity: int) -> tuple[KvTier, list[tuple[int, int]]]:
    tier = make_tier(capacity, shape, torch.bfloat16, "LRU")
    keys = [(3, 7_000_000 + i) for i in range(num_blocks)]  # weight version 3, chained hashes
    for i, key in enumerate(keys):
        tokens = tuple(range(i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS))
        assert tier.put(key, tokens, torch.randn(shape).to(torch.bfloat16))
    return tier, keys


def fetch_rates(
    server: KvServer, target: KvTier, keys: list[tuple[int, int]], channel: str, repeats: int
) -> list[float]:
    """GB/s of whole sync fetches of ``keys`` into ``target`` (emptied before each), after a warm-up."""
    fetcher = KvFetcher(target, channel)  # type: ignore[arg-type]
    fetcher.fetch("warm", server.address, [], 30)
    rates = []
    for repeat in range(repeats + 1):
        target.clear()
        outcome = fetcher.fetch(f"{channel}{repeat}", server.address, keys, 60)
        assert outcome.error == "" and outcome.num_blocks == len(keys), outcome
        rates.append(outcome.num_bytes / outcome.seconds / 1e9)
    fetcher.close()
    fetcher.join(10.0)
    return rates[1:]


def same_blocks(source: KvTier, target: KvTier, keys: list[tuple[int, int]]) -> bool:
    for key in (keys[0], keys[len(keys) // 2], keys[-1]):
        mine, theirs = source.read(key), target.read(key)
        if mine is None or theirs is None or mine[0] != theirs[0] or not torch.equal(mine[1], theirs[1]):
            return False
    return True


def raw_tcp_rates(num_bytes: int, repeats: int, message_bytes: int) -> list[float]:
    """GB/s of ``num_bytes`` in ZeroMQ messages of ``message_bytes`` from a PUSH to a PULL socket,
    sent back to back until the last is received. The two sockets have a ZeroMQ context (an I/O
    thread) each, as two processes would, and as the source's server and the target's fetcher do."""
    payload = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8)
    messages = [payload[i : i + message_bytes].numpy() for i in range(0, num_bytes, message_bytes)]
    receiving, sending = zmq.Context(), zmq.Context()
    pull, push = receiving.socket(zmq.PULL), sending.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    rates = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        for message in messages:
            push.send(message, copy=False)
        for _ in messages:
            pull.recv(copy=False)
        rates.append(num_bytes / (time.perf_counter() - started) / 1e9)
    push.close(0)
    pull.close(0)
    receiving.term()
    sending.term()
    return rates[1:]


def raw_nixl_rates(num_bytes: int, repeats: int) -> list[float]:
    """GB/s of one NIXL WRITE of ``num_bytes`` from a registered buffer into a registered one."""
    target = torch.empty(num_bytes, dtype=torch.uint8)
    landing, writer = NixlLanding([target]), NixlWriter("raw")
    request = FetchRequest(
        "raw", [], "nixl", "", landing.agent.name, landing.metadata, [(target.data_ptr(), num_bytes)]
    )
    writer.stage(num_bytes).copy_(torch.randint(0, 255, (num_bytes,), dtype=torch.uint8))
    rates = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        writer.write_staged(num_bytes, request)
        rates.append(num_bytes / (time.perf_counter() - started) / 1e9)
    landing.close()
    writer.close()
    return rates[1:]


def raw_rates(num_bytes: int, repeats: int, message_bytes: int) -> tuple[float, float]:
    """Median GB/s of raw ZeroMQ (the better of one message and messages of ``message_bytes``) and
    of one raw NIXL write, of ``num_bytes``."""
    tcp = max(statistics.median(raw_tcp_rates(num_bytes, repeats, size)) for size in {num_bytes, message_bytes})
    return tcp, statistics.median(raw_nixl_rates(num_bytes, repeats))


def one_size(model: str, tokens: int, repeats: int) -> dict[str, float]:
    layers, heads, head_dim = GEOMETRIES[model]
    shape = (layers, BLOCK_TOKENS, 2, heads, head_dim)
    num_blocks = tokens // BLOCK_TOKENS
    block_bytes = torch.Size(shape).numel() * 2
    capacity = num_blocks * block_bytes
    source, keys = filled_tier(shape, num_blocks, capacity)
    target = make_tier(capacity, shape, torch.bfloat16, "LRU")
    server = KvServer(source)
    row: dict[str, float] = {"mib": capacity / 2**20, "block_kib": block_bytes / 1024}
    for channel in CHANNELS:
        row[f"fetch_{channel}_gbps"] = statistics.median(fetch_rates(server, target, keys, channel, repeats))
        assert same_blocks(source, target, keys), f"{model} {tokens}: {channel} landed other bytes"
    server.close()
    del source, target
    row["raw_tcp_gbps"], row["raw_nixl_gbps"] = raw_rates(capacity, repeats, PIECE_BLOCKS * block_bytes)
    for channel in CHANNELS:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = transfer_table(args.repeats)
    print(f"RESULT transfer_vs_raw={best_vs_raw(table):.3f}")


if __name__ == "__main__":
    main()
