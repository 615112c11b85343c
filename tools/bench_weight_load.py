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
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from psrl.engine import DEMO_MODEL_DIR, Engine, EngineArgs
from psrl.models.llama import DecoderModel


def load_reordering_on_host(model: DecoderModel, host: dict[str, torch.Tensor]) -> None:
    """The baseline: each slot copies straight from the host tensor (the host lays out the bytes)."""
    with torch.no_grad():
        for name, tensor in host.items():
            for slot in model.check_weight(name, tensor):
                slot.copy_from(tensor)


def timed_load(load: Callable[[], object], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    load()
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
    model = engine.runner.model
    loads: dict[str, Callable[[], object]] = {
        "host_reorder": lambda: load_reordering_on_host(model, host),
        "psrl": lambda: model.load_weights(host.items()),
    }
    times: dict[str, list[float]] = {name: [] for name in loads}
    reference = None
    for _ in range(args.repeats):
        for name, load in loads.items():
            times[name].append(timed_load(load, args.device))
            params = {n: p.detach().clone() for n, p in model.named_parameters()}
            reference = reference or params
            assert all(torch.equal(reference[n], p) for n, p in params.items()), "layouts differ"
    num_bytes = sum(t.numel() * t.element_size() for t in host.values())
    load_ms, host_ms = statistics.median(times["psrl"]), statistics.median(times["host_reorder"])
    print(f"model {args.model.name}: {len(host)} tensors, {num_bytes / 1e9:.3f} GB {args.dtype}, device {args.device}")
    print(f"psrl (move, then reorder on the device): {load_ms:8.1f} ms")
    print(f"baseline (reorder on the host, then move): {host_ms:8.1f} ms")
    print(f"RESULT load_vs_host_reorder={host_ms / load_ms:.2f} load_ms={load_ms:.1f} host_reorder_ms={host_ms:.1f} "
          f"device={args.device}")  # fmt: skip


if __name__ == "__main__":
    main()
