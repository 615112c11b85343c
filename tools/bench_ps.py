#!/usr/bin/env python3
"""Parameter-server weight sync against the raw transport limit, in one run.

    .venv/bin/python tools/bench_ps.py                 # ~0.5 GB fp32, Qwen2.5-0.5B tensor shapes
    .venv/bin/python tools/bench_ps.py --quick         # ~0.1 GB, for CI-class machines
    .venv/bin/python tools/bench_ps.py --transport nixl --shards 4 --serve-dtype bfloat16

What runs: K shard processes (spawned); this process pushes versions 1..R through the psrl pusher
and pulls each one back through the psrl puller into an "engine" state dict (copy_ into
preallocated tensors, the engine's own dtype). The raw limit is measured on the same machine in
the same run: the same number of bytes in the same frame size, zero-copy ZeroMQ between two
processes over ipc (sender -> receiver, timed at the receiver), plus an in-process memcpy.

Phases: serialize (manifest + checksums), push (bytes to every shard, verified, acknowledged),
publish (two-phase commit), pull (manifests + bytes from every shard, verified), load (engine copy).
Ratios: push and pull GB/s over the raw ZeroMQ GB/s, medians over R rounds. Delta sync is measured
in a second phase: shards serve bf16 (the usual rollout dtype), the fp32 model takes Adam-sized
steps of --lr, and a delta puller fetches only what changed (sparse element deltas) next to a
puller that fetches whole versions; delta_bytes_fraction is its bytes over the whole version's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import torch
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.log import configure
from psrl.ps.local import LocalShards
from psrl.ps.pull_stream import PullResult
from psrl.ps.puller import Puller
from psrl.ps.pusher import Pusher, PushResult

GB = 1e9
# Versions 1-3 fill the shards' double buffers and buffer pools (steady state starts at version 4).
WARMUP = 3
HIDDEN, INTER, HEADS, KV_HEADS = 896, 4864, 14, 2  # Qwen2.5-0.5B
HEAD_DIM = HIDDEN // HEADS


def qwen_like_state_dict(num_layers: int, vocab: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Qwen2.5-0.5B tensor names and shapes (tied embeddings), with fewer layers and a smaller vocab."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)

    sd = {"model.embed_tokens.weight": rand(vocab, HIDDEN)}
    kv = KV_HEADS * HEAD_DIM
    for i in range(num_layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = rand(HIDDEN, HIDDEN)
        sd[p + "self_attn.q_proj.bias"] = rand(HIDDEN)
        sd[p + "self_attn.k_proj.weight"] = rand(kv, HIDDEN)
        sd[p + "self_attn.k_proj.bias"] = rand(kv)
        sd[p + "self_attn.v_proj.weight"] = rand(kv, HIDDEN)
        sd[p + "self_attn.v_proj.bias"] = rand(kv)
        sd[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HIDDEN)
        sd[p + "mlp.gate_proj.weight"] = rand(INTER, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = rand(INTER, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = rand(HIDDEN, INTER)
        sd[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=dtype)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=dtype)
    sd["model.norm.weight"] = torch.ones(HIDDEN, dtype=dtype)
    return sd


def model_for_size(target_gb: float) -> tuple[int, int]:
    """(layers, vocab) giving about ``target_gb`` of fp32 weights."""
    per_layer = 4 * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * HEAD_DIM + 3 * HIDDEN * INTER)
    vocab = 32768 if target_gb >= 0.3 else 8192
    layers = max(1, round((target_gb * GB - 4 * vocab * HIDDEN) / per_layer))
    return layers, vocab


def simulate_step(sd: dict[str, torch.Tensor], scenario: str, step: int, lr: float) -> None:
    """One optimizer step's change to the fp32 weights (in place).

    adam: every element moves by up to ``lr`` (Adam's normalised update), as in RL fine-tuning at a
    small learning rate; served in bf16 only the elements that cross a rounding boundary change.
    full: every element moves by 1e-3 (nothing is left unchanged, even in bf16).
    """
    gen = torch.Generator().manual_seed(1000 + step)
    scale = lr if scenario == "adam" else 1e-3
    for t in sd.values():
        t.add_(torch.tanh(torch.randn(t.shape, generator=gen)), alpha=scale)


# raw limits -----------------------------------------------------------------------------------------


def _raw_sender(endpoint: str, num_bytes: int, frame_bytes: int, conn: Connection) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    payload = bytearray(os.urandom(1 << 20) * (num_bytes >> 20))
    view = memoryview(payload)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.bind(endpoint)
    conn.send("ready")
    while True:
        ident, request = sock.recv_multipart()
        if request == b"stop":
            break
        for start in range(0, len(view), frame_bytes):
            sock.send_multipart([ident, view[start : start + frame_bytes]], copy=False)
    sock.close(linger=0)
    ctx.term()


def raw_zmq_gbps(directory: str, num_bytes: int, frame_bytes: int, reps: int) -> list[float]:
    """Receiver-side GB/s of zero-copy frames between two processes over ipc."""
    num_bytes = max(1 << 20, num_bytes >> 20 << 20)
    endpoint = f"ipc://{directory}/raw.sock"
    ctx_mp = mp.get_context("spawn")
    parent, child = ctx_mp.Pipe()
    proc = ctx_mp.Process(target=_raw_sender, args=(endpoint, num_bytes, frame_bytes, child), daemon=True)
    proc.start()
    parent.recv()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(endpoint)
    rates = []
    for _ in range(reps + 1):  # the first round warms the connection and the allocator up
        start = time.perf_counter()
        sock.send(b"go")
        received = 0
        while received < num_bytes:
            received += len(sock.recv(copy=False).buffer)
        rates.append(num_bytes / (time.perf_counter() - start) / GB)
    sock.send(b"stop")
    proc.join(30)
    sock.close(linger=0)
    ctx.term()
    return rates[1:]


def memcpy_gbps(num_bytes: int, reps: int) -> float:
    src = torch.empty(num_bytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src).fill_(0.0)
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        rates.append(src.numel() * 4 / (time.perf_counter() - start) / GB)
    return statistics.median(rates)


# psrl --------------------------------------------------------------------------------------------------


def run_psrl(args: argparse.Namespace, sd: dict[str, torch.Tensor], directory: str) -> dict[str, object]:
    """Push + full pull of every version, loading into an engine state dict."""
    engine_dtype = getattr(torch, args.engine_dtype)
    engine = {name: torch.zeros(t.shape, dtype=engine_dtype) for name, t in sd.items()}

    def load(name: str, tensor: torch.Tensor) -> None:
        engine[name].copy_(tensor)

    shards = LocalShards(directory, args.shards, transport=args.transport, serve_dtype=args.serve_dtype).start()
    pusher = Pusher(shards.push_endpoints, incarnation=1, transport=args.transport, max_block_bytes=args.chunk_mb << 20)
    puller = Puller(shards.pull_endpoints, transport=args.transport)
    pushes: list[PushResult] = []
    pulls: list[PullResult] = []
    try:
        for version in range(1, args.rounds + WARMUP + 1):
            if version > 1:
                simulate_step(sd, args.delta_scenario, version, args.lr)
            pushes.append(pusher.push(version, sd))
            pulls.append(puller.pull(version, load))
        served = getattr(torch, args.serve_dtype) if args.serve_dtype else None
        exact = all(torch.equal(engine[n], sd[n].to(served or sd[n].dtype).to(engine_dtype)) for n in sd)
    finally:
        pusher.close()
        puller.close()
        shards.stop()
    return {"pushes": pushes[WARMUP:], "pulls": pulls[WARMUP:], "exact": exact}


def run_delta(args: argparse.Namespace, sd: dict[str, torch.Tensor], directory: str) -> dict[str, object]:
    """Delta sync: shards serve ``--delta-serve-dtype``; one puller pulls deltas, one pulls whole versions."""
    shards = LocalShards(directory, args.shards, transport="zmq", serve_dtype=args.delta_serve_dtype).start()
    pusher = Pusher(shards.push_endpoints, incarnation=1, max_block_bytes=args.chunk_mb << 20)
    delta = Puller(shards.pull_endpoints, delta_sync=True)
    whole = Puller(shards.pull_endpoints)
    deltas: list[PullResult] = []
    wholes: list[PullResult] = []
    mirror_exact = True
    try:
        for version in range(1, args.rounds + WARMUP + 1):
            if version > 1:
                simulate_step(sd, args.delta_scenario, version, args.lr)
            pusher.push(version, sd)
            wholes.append(whole.pull(version, lambda name, tensor: None))
            deltas.append(delta.pull(version, lambda name, tensor: None))
            served = getattr(torch, args.delta_serve_dtype)
            mirror_exact &= all(torch.equal(delta.mirror.tensor(n), t.to(served)) for n, t in sd.items())
    finally:
        pusher.close()
        delta.close()
        whole.close()
        shards.stop()
    return {"deltas": deltas[WARMUP:], "wholes": wholes[WARMUP:], "exact": mirror_exact}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~0.1 GB model, 3 measured rounds")
    ap.add_argument("--size-gb", type=float, default=0.5)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="measured versions (after 3 warm-up versions)")
    ap.add_argument("--chunk-mb", type=int, default=16)
    ap.add_argument("--transport", default="zmq", choices=["zmq", "shm", "nixl", "torch_dist"])
    ap.add_argument("--serve-dtype", default=None, choices=[None, "bfloat16", "float16", "float32"])
    ap.add_argument("--no-delta", dest="delta", action="store_false", help="skip the delta-sync phase")
    ap.add_argument("--engine-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--delta-scenario", default="adam", choices=["adam", "full"])
    ap.add_argument("--lr", type=float, default=1e-6, help="update size of the adam scenario")
    ap.add_argument("--delta-serve-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args()
    if args.quick:
        args.size_gb, args.rounds = 0.1, 3
    configure("warning")
    torch.set_num_threads(1)
    layers, vocab = model_for_size(args.size_gb)
    sd = qwen_like_state_dict(layers, vocab, torch.float32)
    num_bytes = sum(t.numel() * t.element_size() for t in sd.values())
    print(
        f"model: Qwen2.5-0.5B shapes, {layers} layers, vocab {vocab}, {len(sd)} tensors, {num_bytes / GB:.3f} GB fp32"
    )
    print(f"shards: {args.shards}, transport: {args.transport}, chunk {args.chunk_mb} MiB, rounds {args.rounds}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")

    with tempfile.TemporaryDirectory(dir="/tmp", prefix="bps") as directory:
        raw = raw_zmq_gbps(directory, num_bytes, args.chunk_mb << 20, args.rounds)
        copy = memcpy_gbps(num_bytes, 3)
        result = run_psrl(args, sd, directory)
        result.update(run_delta(args, {n: t.clone() for n, t in sd.items()}, directory) if args.delta else {})
    report(args, num_bytes, raw, copy, result)


def report(args: argparse.Namespace, num_bytes: int, raw: list[float], copy: float, result: dict) -> None:
    pushes: list[PushResult] = result["pushes"]
    pulls: list[PullResult] = result["pulls"]
    raw_gbps = median(raw)
    pulled = pulls[0].num_bytes_total
    phases = {
        "serialize": median([p.serialize_s for p in pushes]),
        "push": median([p.transfer_s for p in pushes]),
        "publish": median([p.commit_s for p in pushes]),
        "pull": median([p.manifest_s + p.transfer_s for p in pulls]),
        "load": median([p.load_s for p in pulls]),
    }
    push_gbps = num_bytes / (phases["push"] + phases["publish"]) / GB
    pull_gbps = pulled / phases["pull"] / GB
    push_e2e = num_bytes / (phases["serialize"] + phases["push"] + phases["publish"]) / GB
    pull_e2e = pulled / (phases["pull"] + phases["load"]) / GB
    print()
    print(f"raw zmq zero-copy ipc: {raw_gbps:.2f} GB/s (median of {len(raw)}: {', '.join(f'{r:.2f}' for r in raw)})")
    print(f"memcpy in one process: {copy:.2f} GB/s")
    print()
    print(f"{'phase':<10} {'ms':>9} {'GB/s':>8}")
    for name, seconds in phases.items():
        size = pulled if name in ("pull", "load") else num_bytes
        print(f"{name:<10} {seconds * 1e3:>9.1f} {size / seconds / GB if seconds else float('inf'):>8.2f}")
    print()
    print(f"{'measure':<34} {'GB/s':>7} {'vs raw':>7}")
    print(f"{'push (push+publish)':<34} {push_gbps:>7.2f} {push_gbps / raw_gbps:>7.2f}")
    print(f"{'pull (manifest+transfer+verify)':<34} {pull_gbps:>7.2f} {pull_gbps / raw_gbps:>7.2f}")
    print(f"{'push end to end (+serialize)':<34} {push_e2e:>7.2f} {push_e2e / raw_gbps:>7.2f}")
    print(f"{'pull end to end (+load)':<34} {pull_e2e:>7.2f} {pull_e2e / raw_gbps:>7.2f}")
    print(f"engine weights equal the last pushed version: {result['exact']}")
    delta_fraction = float("nan")
    if "deltas" in result:
        deltas: list[PullResult] = result["deltas"]
        wholes: list[PullResult] = result["wholes"]
        delta_fraction = median([d.num_bytes / d.num_bytes_total for d in deltas])
        delta_ms = median([d.manifest_s + d.transfer_s + d.load_s for d in deltas]) * 1e3
        whole_ms = median([w.manifest_s + w.transfer_s + w.load_s for w in wholes]) * 1e3
        print()
        print(
            f"delta sync ({args.delta_scenario}, lr {args.lr:g}, served {args.delta_serve_dtype}): "
            f"{median([d.num_bytes for d in deltas]) / 1e6:.1f} of {deltas[0].num_bytes_total / 1e6:.1f} MB per pull "
            f"(fraction {delta_fraction:.4f}), {delta_ms:.1f} ms vs {whole_ms:.1f} ms for a whole pull; "
            f"delta mirror equals the pushed weights: {result['exact']}"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(
        f"RESULT ps_pull_vs_raw={pull_gbps / raw_gbps:.3f} ps_push_vs_raw={push_gbps / raw_gbps:.3f} "
        f"delta_bytes_fraction={delta_fraction:.4f} raw_gbps={raw_gbps:.3f} pull_gbps={pull_gbps:.3f} "
        f"push_gbps={push_gbps:.3f} transport={args.transport} shards={args.shards}"
    )


if __name__ == "__main__":
    main()
