"""How fast this host checks weight bytes: xxh3, the word sum and both in one pass, per thread count.

A push from the GPU hashes every landed byte and checks it against the word sum its source took on
the device (``psrl.ps.checksum.checksum_and_word_sum``), on a pool of threads. This measures the
rates that pass can reach on this host's memory, next to a plain read of it (the word sum alone),
so the pool size can be chosen against a measured limit.

    python tools/bench_host_hash.py --gib 8 --threads 8,16

Ends with ``RESULT dual_gbps_<n>=... xxh3_gbps_<n>=... sum_gbps_<n>=...`` per thread count.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from psrl.ps.checksum import checksum, checksum_and_word_sum

PIECE = 64 << 20  # the push plane's bucket size


def word_sum(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype="<u8").sum(dtype=np.uint64))


def rate(views: list[memoryview], work: Callable[[memoryview], object], threads: int) -> float:
    """GB/s of ``work`` over every view on ``threads`` threads (after a warm-up over a few)."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, views[:threads]))
        start = time.perf_counter()
        list(pool.map(work, views))
        seconds = time.perf_counter() - start
    return sum(len(v) for v in views) / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0, help="host memory to hash")
    parser.add_argument("--threads", default=f"1,{os.cpu_count() or 1}", help="thread counts, comma-separated")
    args = parser.parse_args()
    data = np.random.default_rng(0).integers(0, 256, int(args.gib * (1 << 30)) // PIECE * PIECE, dtype=np.uint8)
    views = [memoryview(data)[o : o + PIECE] for o in range(0, len(data), PIECE)]
    results = []
    for threads in (int(t) for t in args.threads.split(",")):
        rates = {name: rate(views, work, threads) for name, work in
                 (("xxh3", checksum), ("dual", checksum_and_word_sum), ("sum", word_sum))}  # fmt: skip
        print(f"{threads:>3} threads: " + ", ".join(f"{n} {r:.1f} GB/s" for n, r in rates.items()), flush=True)
        results += [f"{name}_gbps_{threads}={value:.1f}" for name, value in rates.items()]
    print("RESULT " + " ".join(results))


if __name__ == "__main__":
    main()
