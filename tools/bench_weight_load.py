"""Loading host weights into the engine: reorder on the target device against reorder on the host.

A rollout instance receives a version's tensors in host memory (from the PS) and copies them into its
engine, whose layout differs from Hugging Face's (fused q|k|v and gate|up, transposed projections,
interleaved rotary halves). psrl moves each tensor to the engine's device first and reorders it
there; the baseline reorders on the host first (what a plain ``param.copy_(tensor.t())`` across
devices does), then transfers. Both must give identical weights.

    python3 tools/bench_weight_load.py --model /tmp/m05 --device cuda      # e.g. tools/random_model.py output

Last line: ``RESULT load_vs_host_reorder=<speedup> load_ms=... host_reorder_ms=...``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

import psrl.models.weights as weights_module
from psrl.engine import DEMO_MODEL_DIR, Engine, EngineArgs


def reorder_on_host(self: weights_module.WeightSlot, tensor: torch.Tensor) -> None:
    if self.num_interleaved_heads:
        tensor = weights_module.to_interleaved_halves(tensor, self.num_interleaved_heads)
    self.target.copy_(tensor.t() if self.is_transposed else tensor)


def timed_load(engine: Engine, host: dict[str, torch.Tensor], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    engine.load_weights(host, 1)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEMO_MODEL_DIR)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (an actor process has 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    host = {name: t.to(dtype).contiguous() for name, t in load_file(args.model / "model.safetensors").items()}
    engine = Engine(EngineArgs(model_path=args.model, dtype=args.dtype, device=args.device, num_kv_blocks=16,
                               max_num_seqs=4))  # fmt: skip
    ours = weights_module.WeightSlot.copy_from
    times: dict[str, list[float]] = {"psrl": [], "host_reorder": []}
    reference = None
    for _ in range(args.repeats):
        for name, method in (("host_reorder", reorder_on_host), ("psrl", ours)):
            weights_module.WeightSlot.copy_from = method  # type: ignore[method-assign]
            times[name].append(timed_load(engine, host, args.device))
            params = {n: p.detach().clone() for n, p in engine.runner.model.named_parameters()}
            reference = reference or params
            assert all(torch.equal(reference[n], p) for n, p in params.items()), "layouts differ"
    weights_module.WeightSlot.copy_from = ours  # type: ignore[method-assign]
    num_bytes = sum(t.numel() * t.element_size() for t in host.values())
    load_ms, host_ms = statistics.median(times["psrl"]), statistics.median(times["host_reorder"])
    print(f"model {args.model.name}: {len(host)} tensors, {num_bytes / 1e9:.3f} GB {args.dtype}, device {args.device}")
    print(f"psrl (move, then reorder on the device): {load_ms:8.1f} ms")
    print(f"baseline (reorder on the host, then move): {host_ms:8.1f} ms")
    print(f"RESULT load_vs_host_reorder={host_ms / load_ms:.2f} load_ms={load_ms:.1f} host_reorder_ms={host_ms:.1f} "
          f"device={args.device}")  # fmt: skip


if __name__ == "__main__":
    main()
