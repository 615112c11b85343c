#!/usr/bin/env python3
"""Sparse delta codec (``psrl.ps.delta``) on one bf16 entry: bytes saved and encode/apply speed.

    python3 tools/bench_delta_codec.py                 # 64 MiB bf16, AdamW steps and a synthetic pattern
    python3 tools/bench_delta_codec.py --mib 16 --lr 1e-5

Two kinds of change between consecutive served versions of one tensor:

* ``adamw``: fp32 master weights (randn * 0.02) take ``torch.optim.AdamW`` steps on random
  gradients; the served bf16 copies of steps ``--warmup`` and ``--warmup + 1`` are compared.
* ``perturb``: ``--fraction`` of the bf16 elements move by +-1 unit in the last place, and a tenth
  of that fraction again take arbitrary new values (wide escapes).

Reported per pattern: changed fraction, dense bytes / delta bytes (and the same for the earlier
int32-index + full-value format, 6 bytes a change), encode and apply throughput in GB/s of dense
entry bytes (best of ``--reps``), and whether the applied delta equals the target bit for bit.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.ps.delta import apply_sparse, encode_sparse
from psrl.ps.dtypes import byte_view

GB = 1e9
INDEX_VALUE_BYTES = 4 + 2  # the earlier format: int32 index and bf16 value per change


def adamw_versions(num_elems: int, lr: float, warmup: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(num_elems, generator=gen) * 0.02)
    optimizer = torch.optim.AdamW([weights], lr=lr, weight_decay=0.01)
    served = weights.detach().to(torch.bfloat16)
    for _ in range(warmup + 1):
        served = weights.detach().to(torch.bfloat16)
        weights.grad = torch.randn(num_elems, generator=gen)
        optimizer.step()
    return served, weights.detach().to(torch.bfloat16)


def perturbed_versions(num_elems: int, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    base = (torch.randn(num_elems, generator=gen) * 0.02).to(torch.bfloat16)
    bits = base.view(torch.int16).clone()
    moved = torch.rand(num_elems, generator=gen) < fraction
    steps = torch.randint(0, 2, (num_elems,), generator=gen, dtype=torch.int16) * 2 - 1
    bits[moved] += steps[moved]
    jumped = torch.rand(num_elems, generator=gen) < fraction / 10
    bits[jumped] = torch.randint(-(2**15), 2**15, (int(jumped.sum()),), generator=gen, dtype=torch.int16)
    return base, bits.view(torch.bfloat16)


def best_seconds(run: Callable[[], object], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure(base: torch.Tensor, target: torch.Tensor, reps: int) -> dict[str, float]:
    dense = base.numel() * base.element_size()
    old, new = byte_view(base), byte_view(target)
    payload = encode_sparse(old, new, "bfloat16")
    if payload is None:
        raise SystemExit("the delta is not smaller than half the entry: lower --lr or --fraction")
    encode_s = best_seconds(lambda: encode_sparse(old, new, "bfloat16"), reps)
    copies = [base.clone() for _ in range(reps)]
    fresh = iter(copies)
    apply_s = best_seconds(lambda: apply_sparse(byte_view(next(fresh)), payload, "bfloat16"), reps)
    changed = int((base.view(torch.int16) != target.view(torch.int16)).sum())
    return {
        "changed_fraction": changed / base.numel(),
        "bytes_ratio": dense / len(payload),
        "index_value_ratio": dense / max(1, changed * INDEX_VALUE_BYTES),
        "encode_gbps": dense / encode_s / GB,
        "apply_gbps": dense / apply_s / GB,
        "exact": float(all(torch.equal(c.view(torch.int16), target.view(torch.int16)) for c in copies)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="size of the bf16 entry")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--warmup", type=int, default=3, help="AdamW steps before the measured one")
    ap.add_argument("--fraction", type=float, default=0.025)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    num_elems = (args.mib << 20) // 2
    patterns = {
        "adamw": adamw_versions(num_elems, args.lr, args.warmup),
        "perturb": perturbed_versions(num_elems, args.fraction),
    }
    out = []
    for name, (base, target) in patterns.items():
        figures = measure(base, target, args.reps)
        print(f"{name:<8} " + " ".join(f"{k}={v:.4g}" for k, v in figures.items()), flush=True)
        out.append(" ".join(f"{name}_{k}={v:.4g}" for k, v in figures.items()))
    print(f"RESULT mib={args.mib} lr={args.lr:g} " + " ".join(out))


if __name__ == "__main__":
    main()
