"""What the offload tier's bookkeeping costs a KV fetch per block, against copying the block's bytes.

A fetch's tier work for one piece, on both sides: the target reserves room for it, lands it (the
blocks become entries) and later drops it; the source lends the blocks to its sender. This times
that cycle for pieces of 64 blocks of Qwen2.5-0.5B and -7B KV (bf16, 16 tokens a block) in LMCache's
store, against a plain copy of the same bytes between two warm buffers in the same run (what moving
the block costs at the least, on this machine's memory):

    .venv-kv/bin/python tools/bench_kv_tier.py

Ends with ``RESULT`` per shape: microseconds of tier work and of copy per block, and their ratio.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.engine.kv_offload import make_tier
from psrl.kvcache.host_buffer import huge_page_buffer

PIECE = 64
SHAPES = {"0.5b": (24, 16, 2, 2, 64), "7b": (28, 16, 2, 4, 128)}  # layers, tokens, K/V, KV heads, head dim
ROUNDS = 30


def per_block_us(action: Callable[[], None]) -> float:
    """Median over ``ROUNDS`` of one call of ``action`` (after a warm-up), in microseconds per block."""
    action()
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / PIECE * 1e6


def tier_cycle(shape: tuple[int, ...]) -> Callable[[], None]:
    """One piece's tier work: the source lends it; the target reserves, lands and clears it."""
    block_bytes = torch.Size(shape).numel() * 2
    source = make_tier(4 * PIECE * block_bytes, shape, torch.bfloat16, "LRU")
    target = make_tier(4 * PIECE * block_bytes, shape, torch.bfloat16, "LRU")
    keys = [(1, 9_000 + i) for i in range(PIECE)]
    tokens = [tuple(range(i * 16, (i + 1) * 16)) for i in range(PIECE)]
    assert source.put_many(keys, tokens, torch.zeros((PIECE, *shape), dtype=torch.bfloat16)) == PIECE

    def cycle() -> None:
        _, _, release = source.lend_many(keys)
        release()
        assert target.land_reserved(keys, tokens, target.reserve(PIECE)) == PIECE
        target.clear()

    return cycle


def copy_cycle(shape: tuple[int, ...]) -> Callable[[], None]:
    nbytes = PIECE * torch.Size(shape).numel() * 2
    source, target = huge_page_buffer(nbytes), huge_page_buffer(nbytes)
    source.fill_(1)
    target.zero_()

    def cycle() -> None:
        target.copy_(source)

    return cycle


def main() -> None:
    torch.set_num_threads(1)
    fields = []
    for name, shape in SHAPES.items():
        tier_us, copy_us = per_block_us(tier_cycle(shape)), per_block_us(copy_cycle(shape))
        print(f"{name}: tier work {tier_us:.2f} us a block, copy {copy_us:.2f} us a block", flush=True)
        fields += [f"tier_us_{name}={tier_us:.2f}", f"copy_us_{name}={copy_us:.2f}",
                   f"tier_vs_copy_{name}={tier_us / copy_us:.3f}"]  # fmt: skip
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
