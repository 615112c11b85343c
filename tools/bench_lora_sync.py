#!/usr/bin/env python3
"""LoRA weight sync: bytes per version against full weights, measured on the demo model through real
parameter-server shards and computed for published shapes from their parameter counts; the merge a
rollout engine does on load, timed at a published shape on ``--device``.

    python3 tools/bench_lora_sync.py                                   # CPU: demo measured, shapes counted
    python3 tools/bench_lora_sync.py --rank 16 --merge-shape qwen2.5-1.5b --device cuda \
        --engine-shape qwen2.5-1.5b --transport shm                   # on the GPU: merge, and sync + load
    python3 tools/bench_lora_sync.py --modes demo --only-modes           # merge vs unmerged serving, CPU
    python3 tools/bench_lora_sync.py --rank 16 --device cuda --merge-shape qwen2.5-1.5b \
        --engine-shape qwen2.5-1.5b --engine-modes merge,unmerged --transport shm \
        --modes qwen2.5-1.5b --modes-batch 64 --modes-tokens 128      # the GPU: all of it, both serving modes

Measured: two shard processes (``psrl.ps.local``, zmq); the demo model's full weights pushed and
pulled as one version, then ``--versions`` adapter versions (rank ``--rank`` on ``--targets``) pushed and
pulled into an embedded engine that merges them (``psrl.engine.lora_merge``). Computed: for each
shape in ``psrl.models.shapes``, the adapters' parameters (a meta-device model with adapters put on
by ``psrl.trainer.lora``) against the model's (tied head once); bytes per version are those counts
times the served dtype's size, so the ratio is the parameter ratio. Merge: the base weights of every
target projection at ``--merge-shape`` (random, served dtype) and one adapter version, merged the way
the engine merges on load (``AdapterMerger.prepare``), median of ``--rounds``. Sync + load
(``--engine-shape``): a random checkpoint of that shape (``tools/random_model.py``) served by an embedded
engine on ``--device``; each adapter version is pushed, then pulled, merged and loaded, timed from the
pull's start to the engine holding it (median over the versions after the first). Modes (``--modes``,
``tools/lora_serving_modes.py``): the embedded engine serving the versions merged (``engine.lora_mode=merge``)
and unmerged, at the demo model or a random checkpoint of a published shape: load of a version and
decode step time of each, and their ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import Qwen2Config, Qwen2ForCausalLM

from psrl.assets import DEMO_MODEL_DIR
from psrl.config.training import LORA_TARGETS
from psrl.engine import Engine, EngineArgs
from psrl.engine.lora_merge import AdapterMerger, LoraServing
from psrl.log import configure
from psrl.models import iter_safetensors
from psrl.models.lora import adapter_names
from psrl.models.shapes import BODIES, VOCABULARIES
from psrl.ps.local import LocalShards
from psrl.ps.puller import Puller
from psrl.ps.pusher import Pusher
from psrl.trainer.lora import LoraSettings, apply_lora
from psrl.trainer.lora import adapter_names as model_adapter_names
from tools.lora_serving_modes import adapter_version, compare_modes


def demo_weights() -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in iter_safetensors(DEMO_MODEL_DIR)}


def measure_demo(rank: int, targets: tuple[str, ...], versions: int) -> dict[str, float]:
    full = demo_weights()
    engine = Engine(EngineArgs(dtype="float32", device="cpu", num_kv_blocks=64, lora=LoraServing(2.0 * rank, targets)))
    with tempfile.TemporaryDirectory(prefix="lora", dir="/tmp") as sockets, LocalShards(sockets, 2) as shards:
        pusher = Pusher(shards.push_endpoints, incarnation=1, timeout_s=60)
        puller = Puller(shards.pull_endpoints, timeout_s=30)
        try:
            full_push = pusher.push(1, full)
            full_pull = puller.pull(1, lambda name, tensor: None)
            adapter_bytes = []
            for version in range(2, versions + 2):
                adapters = adapter_version(full, targets, rank, seed=version)
                pushed = pusher.push(version, adapters)
                stream = puller.stream(version)
                engine.load_weights(stream, version)
                adapter_bytes.append((pushed.num_bytes, stream.result.num_bytes))
        finally:
            pusher.close()
            puller.close()
    pushed_bytes, pulled_bytes = adapter_bytes[-1]
    print(f"demo model: full version pushed {full_push.num_bytes} B, pulled {full_pull.num_bytes} B; adapter "
          f"version (rank {rank}, {','.join(targets)}) pushed {pushed_bytes} B, pulled {pulled_bytes} B")  # fmt: skip
    return {"demo_full_bytes": full_push.num_bytes, "demo_adapter_bytes": pushed_bytes,
            "demo_ratio": full_pull.num_bytes / pulled_bytes}  # fmt: skip


def measure_sync_load(shape: str, rank: int, targets: tuple[str, ...], device: torch.device, versions: int,
                      transport: str, mode: str = "merge") -> float:  # fmt: skip
    """Median milliseconds from a committed adapter version to an engine that serves it (pull + merge + load, or
    pull + adapter copy under ``mode=unmerged``), for an engine on ``device`` over a random checkpoint of
    ``shape`` (the demo tokenizer's vocabulary)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from random_model import write_model

    with tempfile.TemporaryDirectory(prefix="lora_model") as model_dir:
        write_model(shape, Path(model_dir), max_positions=512)
        base = dict(iter_safetensors(model_dir))
        args = EngineArgs(model_path=model_dir, device=device.type, num_kv_blocks=64, cuda_graphs=False,
                          lora=LoraServing(2.0 * rank, targets, rank, mode))  # type: ignore[arg-type]  # fmt: skip
        engine = Engine(args)
        serve = "bfloat16" if engine.dtype == torch.bfloat16 else None  # what psrl.ps.serve_dtype=engine does
        with (
            tempfile.TemporaryDirectory(prefix="lora", dir="/tmp") as sockets,
            LocalShards(sockets, 2, transport=transport, serve_dtype=serve) as shards,
        ):
            pusher = Pusher(shards.push_endpoints, incarnation=1, transport=transport, timeout_s=120)
            puller = Puller(shards.pull_endpoints, transport=transport, timeout_s=60)
            try:
                seconds = []
                for version in range(1, versions + 1):
                    pusher.push(version, adapter_version(base, targets, rank, seed=version))
                    started = time.perf_counter()
                    engine.load_weights(puller.stream(version), version)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    seconds.append(time.perf_counter() - started)
            finally:
                pusher.close()
                puller.close()
    return statistics.median(seconds[1:] if len(seconds) > 1 else seconds) * 1000  # the first pull warms up


def shape_counts(shape: str, rank: int, targets: tuple[str, ...]) -> tuple[int, int]:
    """(parameters of a full version, parameters of an adapter version) at a published shape."""
    body = {k: v for k, v in BODIES[shape].items() if k != "rope_theta"}
    config = Qwen2Config(**body, **VOCABULARIES[shape])
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
        apply_lora(model, LoraSettings(rank, 2.0 * rank, 0.0, targets))
    state = model.state_dict()
    adapters = set(model_adapter_names(model))
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    full = sum(t.numel() for n, t in state.items() if n not in adapters and n not in tied)
    return full, sum(state[n].numel() for n in adapters)


def time_merge(shape: str, rank: int, targets: tuple[str, ...], device: torch.device, rounds: int) -> float:
    """Median seconds to merge one adapter version into every target projection at ``shape``."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    body = BODIES[shape]
    hidden, inter = int(body["hidden_size"]), int(body["intermediate_size"])
    kv = int(body["num_key_value_heads"]) * hidden // int(body["num_attention_heads"])
    shapes = {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, hidden),
              "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}  # fmt: skip
    layers = [f"model.layers.{i}.{'mlp' if 'p_proj' in t or 'down' in t else 'self_attn'}.{t}"
              for i in range(int(body["num_hidden_layers"])) for t in targets]  # fmt: skip
    merger = AdapterMerger(LoraServing(2.0 * rank, targets), device, dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    version = []
    for module in layers:
        out_features, in_features = shapes[module.rpartition(".")[2]]
        merger.base[module] = torch.randn(out_features, in_features, generator=gen, device=device).to(dtype)
        lora_a, lora_b = adapter_names(module)
        version.append((lora_a, torch.randn(rank, in_features, generator=gen, device=device).to(dtype)))
        version.append((lora_b, torch.randn(out_features, rank, generator=gen, device=device).to(dtype)))
    seconds = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        merged = merger.prepare(version)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
        merger.commit()
        del merged
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default=",".join(LORA_TARGETS), help="comma-separated projections")
    parser.add_argument("--demo-rank", type=int, default=8, help="rank of the measured demo-model versions")
    parser.add_argument("--demo-targets", default="q_proj,v_proj")
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--merge-shape", default="qwen2.5-1.5b", choices=sorted(BODIES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--engine-shape",
        default="",
        choices=["", *sorted(BODIES)],
        help="also time pull + merge + load into an engine on --device at this shape",
    )
    parser.add_argument("--transport", default="zmq", help="PS transport of the --engine-shape measurement")
    parser.add_argument("--engine-modes", default="merge", help="engine.lora_mode(s) of --engine-shape: merge,unmerged")
    parser.add_argument(
        "--modes",
        default="",
        choices=["", "demo", *sorted(BODIES)],
        help="also compare engine.lora_mode=merge and unmerged (load, decode step) at this shape",
    )
    parser.add_argument("--modes-batch", type=int, default=8, help="decode batch of --modes")
    parser.add_argument("--modes-tokens", type=int, default=32, help="tokens each --modes request generates")
    parser.add_argument("--only-modes", action="store_true", help="run the --modes comparison only")
    args = parser.parse_args()
    configure(level="warning")
    targets = tuple(args.targets.split(","))
    modes = measure_modes(args, targets) if args.modes else {}
    if args.only_modes:
        print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in modes.items()))
        return
    result = measure_demo(args.demo_rank, tuple(args.demo_targets.split(",")), args.versions)
    for shape in sorted(BODIES):
        for name, chosen in (("all", targets), ("attn", ("q_proj", "k_proj", "v_proj", "o_proj"))):
            full, adapters = shape_counts(shape, args.rank, chosen)
            print(f"{shape} rank {args.rank} {name}: full {full / 1e6:.1f} M parameters, adapters "
                  f"{adapters / 1e6:.2f} M: {full / adapters:.0f}x fewer bytes per version")  # fmt: skip
            result[f"{shape}_{name}_ratio"] = full / adapters
    merge_s = time_merge(args.merge_shape, args.rank, targets, torch.device(args.device), args.rounds)
    print(f"merge of one version at {args.merge_shape} (rank {args.rank}, {len(targets)} projections per layer) "
          f"on {args.device}: {merge_s * 1000:.1f} ms")  # fmt: skip
    result["merge_ms"] = merge_s * 1000
    for mode in args.engine_modes.split(",") if args.engine_shape else []:
        sync_ms = measure_sync_load(args.engine_shape, args.rank, targets, torch.device(args.device),
                                    args.versions + 1, args.transport, mode)  # fmt: skip
        where = f"{args.engine_shape} on {args.device} ({args.transport}, lora_mode={mode})"
        print(f"sync + load of one version at {where}: {sync_ms:.1f} ms")
        result["sync_load_ms" if mode == "merge" else f"sync_load_ms_{mode}"] = sync_ms
    result.update(modes)
    print("RESULT " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))


def measure_modes(args: argparse.Namespace, targets: tuple[str, ...]) -> dict[str, float]:
    from tools.random_model import write_model

    device = torch.device(args.device)
    if args.modes == "demo":
        return compare_modes(DEMO_MODEL_DIR, args.rank, targets, device, args.versions + 1, args.modes_batch,
                             args.modes_tokens)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="lora_modes") as model_dir:
        write_model(args.modes, Path(model_dir), max_positions=512)
        return compare_modes(Path(model_dir), args.rank, targets, device, args.versions + 1, args.modes_batch,
                             args.modes_tokens)  # fmt: skip


if __name__ == "__main__":
    main()
