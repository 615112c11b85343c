#!/usr/bin/env python3
"""Weight sync at model size on one GPU host, phase by phase, against the machine's copy limits.

    python3 tools/bench_weight_sync.py --shapes qwen2.5-1.5b,qwen2.5-7b      # one H200: ~3 minutes
    python3 tools/bench_weight_sync.py --shapes qwen2.5-0.5b --device cpu --rounds 2   # CPU check
    python3 tools/bench_weight_sync.py --shapes qwen2.5-0.5b --device cpu --delta-only  # delta sync only

What runs: K shard processes (spawned, ``--transport``, shm by default); this process is both the
trainer (fp32 weights of the published shape on the device, an Adam-sized step per version) and a
rollout engine (bf16 weights on the device). Each version is staged (cast to bf16 on the device,
copied to pinned host memory), hashed, pushed, committed, pulled and loaded into the engine's
tensors. Limits measured in the same run: pinned device-to-host and host-to-device copies, and a
host memcpy, each on a buffer of ``--probe-gb``. The floor of a sync is the model's bf16 bytes at
the pinned D2H bandwidth plus the same at the H2D bandwidth; ``sync_vs_floor`` is the whole sync
(stage + hash + push + commit + pull + load) over it, and ``load`` is what a rollout instance stops
for when it prefetched the version. Delta sync (zmq transport, sparse deltas, bf16 served) runs on
the first shape: bytes moved per step over a full version's, and whether the delta mirror equals
the pushed weights bit for bit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.log import configure
from psrl.models.shapes import BODIES, VOCABULARIES
from psrl.ps.from_config import block_mib
from psrl.ps.local import LocalShards
from psrl.ps.puller import Puller
from psrl.ps.pusher import Pusher
from psrl.ps.staging import DeviceWeights, HostStaging

GB = 1e9
WARMUP = 3  # a shard rotates three buffers (incoming, latest, previous): each is first written in v1-v3


def shaped_weights(shape: str, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Random weights with the names and shapes of the published model."""
    body, vocab = BODIES[shape], VOCABULARIES[shape]
    hidden, inter = int(body["hidden_size"]), int(body["intermediate_size"])
    heads, kv_heads = int(body["num_attention_heads"]), int(body["num_key_value_heads"])
    kv = kv_heads * hidden // heads
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=gen, device=device, dtype=dtype) * 0.02

    sd = {"model.embed_tokens.weight": rand(int(vocab["vocab_size"]), hidden)}
    for i in range(int(body["num_hidden_layers"])):
        p = f"model.layers.{i}."
        for name, dims in (("q", (hidden, hidden)), ("k", (kv, hidden)), ("v", (kv, hidden))):
            sd[f"{p}self_attn.{name}_proj.weight"] = rand(*dims)
            sd[f"{p}self_attn.{name}_proj.bias"] = rand(dims[0])
        sd[p + "self_attn.o_proj.weight"] = rand(hidden, hidden)
        sd[p + "mlp.gate_proj.weight"] = rand(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = rand(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = rand(hidden, inter)
        sd[p + "input_layernorm.weight"] = torch.ones(hidden, device=device, dtype=dtype)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(hidden, device=device, dtype=dtype)
    sd["model.norm.weight"] = torch.ones(hidden, device=device, dtype=dtype)
    if not vocab["tie_word_embeddings"]:
        sd["lm_head.weight"] = rand(int(vocab["vocab_size"]), hidden)
    return sd


def adam_like_step(weights: dict[str, torch.Tensor], step: int, lr: float) -> None:
    """Every fp32 element moves by up to ``lr``; in bf16 only those crossing a rounding step change."""
    gen = torch.Generator(device=next(iter(weights.values())).device).manual_seed(1000 + step)
    for t in weights.values():
        t.add_(torch.tanh(torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype)), alpha=lr)


# limits -----------------------------------------------------------------------------------------


def _best_rate(num_bytes: int, copy: Callable[[], None], sync: Callable[[], None], reps: int = 3) -> float:
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        copy()
        sync()
        rates.append(num_bytes / (time.perf_counter() - start) / GB)
    return max(rates)


def measure_limits(device: torch.device, probe_bytes: int) -> dict[str, float]:
    """GB/s of pinned D2H and H2D copies and of a host memcpy, in this run."""
    host_a = torch.empty(probe_bytes, dtype=torch.uint8).fill_(1)
    host_b = torch.empty(probe_bytes, dtype=torch.uint8).fill_(2)
    limits = {"memcpy": _best_rate(probe_bytes, lambda: host_b.copy_(host_a), lambda: None)}
    if device.type == "cuda":
        pinned = torch.empty(probe_bytes, dtype=torch.uint8, pin_memory=True).fill_(3)
        on_device = torch.empty(probe_bytes, dtype=torch.uint8, device=device).fill_(4)
        sync = torch.cuda.synchronize
        limits["d2h"] = _best_rate(probe_bytes, lambda: pinned.copy_(on_device, non_blocking=True), sync)
        limits["h2d"] = _best_rate(probe_bytes, lambda: on_device.copy_(pinned, non_blocking=True), sync)
        limits["h2d_pageable"] = _best_rate(probe_bytes, lambda: on_device.copy_(host_a), sync)
        del pinned, on_device
    else:  # no device: both sides of the floor are host copies
        limits["d2h"] = limits["h2d"] = limits["h2d_pageable"] = limits["memcpy"]
    return limits


# one shape -------------------------------------------------------------------------------------------


def run_shape(args: argparse.Namespace, shape: str, device: torch.device, directory: str) -> dict[str, float]:
    trainer = shaped_weights(shape, device, torch.float32)
    engine = {name: torch.empty(t.shape, dtype=torch.bfloat16, device=device) for name, t in trainer.items()}
    staging = HostStaging(cast_to=torch.bfloat16)
    shards = LocalShards(directory, args.shards, transport=args.transport).start()
    pusher = Pusher(
        shards.push_endpoints,
        incarnation=1,
        transport=args.transport,
        max_block_bytes=block_mib(args.transport, args.chunk_mb) << 20,
    )
    puller = Puller(shards.pull_endpoints, transport=args.transport, pin_memory=device.type == "cuda")

    def load(name: str, tensor: torch.Tensor) -> None:
        engine[name].copy_(tensor, non_blocking=True)

    rows: list[dict[str, float]] = []
    try:
        for version in range(1, WARMUP + args.rounds + 1):
            adam_like_step(trainer, version, args.lr)
            sync_device(device)
            started = time.perf_counter()
            if args.host_staging or not pusher.copies_from_device or device.type != "cuda":
                staged: Any = staging.stage(trainer, wait=False)  # hashed tensor by tensor as copies land
                staged_at = time.perf_counter()
                pushed = pusher.push(version, staged, staging.wait_for)
            else:  # device to the shards' memory, hashed there (what the trainer actor does)
                staged_at = time.perf_counter()
                pushed = pusher.push(version, DeviceWeights(trainer, staging.cast_to))
            pull_start = time.perf_counter()
            pulled = puller.pull(version, load)
            loaded = time.perf_counter()
            sync_device(device)
            done = time.perf_counter()
            rows.append({
                "stage": staged_at - started,
                "hash": pushed.serialize_s,
                "push": pushed.transfer_s,
                "commit": pushed.commit_s,
                "pull": pulled.manifest_s + pulled.transfer_s,
                "load": pulled.load_s + (done - loaded),
                "total": done - started,
                "pull_wall": done - pull_start,
                "bytes": pushed.num_bytes,
            })  # fmt: skip
            print(f"  {shape} v{version}: " + " ".join(f"{k}={v:.3f}" for k, v in rows[-1].items() if k != "bytes"),
                  flush=True)  # fmt: skip
        exact = all(torch.equal(engine[n], t.to(torch.bfloat16)) for n, t in trainer.items())
    finally:
        pusher.close()
        puller.close()
        shards.stop()
    measured = rows[WARMUP:]
    result = {key: statistics.median(r[key] for r in measured) for key in measured[0]}
    result["exact"] = float(exact)
    return result


def run_delta(args: argparse.Namespace, shape: str, device: torch.device, directory: str) -> dict[str, float]:
    """zmq sparse deltas from a bf16-serving PS, next to whole pulls, over Adam-sized steps."""
    trainer = shaped_weights(shape, device, torch.float32)
    staging = HostStaging(cast_to=torch.bfloat16)
    shards = LocalShards(directory, args.shards, transport="zmq").start()
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=block_mib("zmq", args.chunk_mb) << 20)
    delta = Puller(shards.pull_endpoints, delta_sync=True)
    ratios, seconds, fractions, exact = [], [], [], True
    try:
        for version in range(1, WARMUP + args.rounds + 1):
            adam_like_step(trainer, version, args.lr)
            staged = staging.stage(trainer)
            pusher.push(version, staged)
            if version > WARMUP:  # the mirror still holds the previous version
                fractions.append(changed_fraction(delta.mirror.tensor, staged))
            start = time.perf_counter()
            pulled = delta.pull(version, lambda name, tensor: None)
            if version > WARMUP:
                seconds.append(time.perf_counter() - start)
                ratios.append(pulled.num_bytes_total / max(1, pulled.num_bytes))
            exact &= all(torch.equal(delta.mirror.tensor(n), t) for n, t in staged.items())
    finally:
        pusher.close()
        delta.close()
        shards.stop()
    return {
        "delta_bytes_ratio": statistics.median(ratios),
        "delta_pull_s": statistics.median(seconds),
        "changed_fraction": statistics.median(fractions),
        "exact": exact,
    }


def changed_fraction(held: Callable[[str], torch.Tensor], staged: dict[str, torch.Tensor]) -> float:
    """Fraction of served (bf16) elements whose bits differ between the held and the new version."""
    changed = sum(int((held(n).view(torch.int16) != t.view(torch.int16)).sum()) for n, t in staged.items())
    return changed / sum(t.numel() for t in staged.values())


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(shape: str, result: dict[str, float], limits: dict[str, float]) -> dict[str, float]:
    num_bytes = result["bytes"]
    floor = num_bytes / (limits["d2h"] * GB) + num_bytes / (limits["h2d"] * GB)
    print(f"\n{shape}: {num_bytes / GB:.2f} GB bf16, floor {floor:.3f} s (D2H + H2D at the pinned rates)")
    print(f"  {'phase':<8} {'s':>8} {'GB/s':>8}")
    for phase in ("stage", "hash", "push", "commit", "pull", "load", "total"):
        seconds = result[phase]
        print(f"  {phase:<8} {seconds:>8.3f} {num_bytes / seconds / GB if seconds else float('inf'):>8.2f}")
    print(f"  engine weights equal the trainer's (bf16): {bool(result['exact'])}")
    return {"sync_s": result["total"], "sync_vs_floor": result["total"] / floor, "load_s": result["load"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen2.5-1.5b,qwen2.5-7b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--transport", default="shm", choices=["shm", "zmq"])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="measured versions per shape (after 2 warm-up ones)")
    ap.add_argument("--chunk-mb", type=int, default=0, help="largest entry; 0 = what psrl.ps.chunk_mb=0 picks")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--probe-gb", type=float, default=2.0)
    ap.add_argument("--no-delta", dest="delta", action="store_false")
    ap.add_argument("--host-staging", action="store_true",
                    help="push from pinned host staging buffers (hashed there), not straight from the GPU")  # fmt: skip
    ap.add_argument("--delta-only", action="store_true", help="only the delta sync phase (no limits, no full syncs)")
    args = ap.parse_args()
    if args.delta_only and not args.delta:
        ap.error("--delta-only and --no-delta exclude each other")
    configure("warning")
    device = torch.device(args.device)
    print(f"device {device}, transport {args.transport}, {args.shards} shards, {os.cpu_count()} CPUs")
    limits: dict[str, float] = {}
    if not args.delta_only:
        limits = measure_limits(device, int(args.probe_gb * GB))
        print("limits GB/s: " + ", ".join(f"{k} {v:.1f}" for k, v in limits.items()))
    shapes = args.shapes.split(",")
    out: list[str] = []
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="bws") as directory:
        if args.delta:
            delta = run_delta(args, shapes[0], device, directory)
            ratio, pull_s = delta["delta_bytes_ratio"], delta["delta_pull_s"]
            print(f"\ndelta sync ({shapes[0]}, zmq, lr {args.lr:g}): {ratio:.1f}x fewer bytes than a full version,")
            print(f"  {pull_s:.3f} s per pull, {delta['changed_fraction']:.2%} of elements changed per step,")
            print(f"  mirror bit-exact: {delta['exact']}")
            out.append(f"delta_bytes_ratio={delta['delta_bytes_ratio']:.2f} delta_exact={int(delta['exact'])}")
            out.append(f"delta_pull_s={pull_s:.3f} delta_changed_fraction={delta['changed_fraction']:.4f}")
        if args.delta_only:
            print(f"RESULT shape={shapes[0]} lr={args.lr:g} " + " ".join(out))
            return
        for shape in shapes:
            figures = report(shape, run_shape(args, shape, device, directory), limits)
            tag = shape.rsplit("-", 1)[-1]
            out.append(" ".join(f"{k}_{tag}={v:.3f}" for k, v in figures.items()))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(
        f"RESULT transport={args.transport} d2h_gbps={limits['d2h']:.1f} h2d_gbps={limits['h2d']:.1f} " + " ".join(out)
    )


if __name__ == "__main__":
    main()
