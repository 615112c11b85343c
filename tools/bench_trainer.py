"""The trainer step alone on the real-scale workload, against the GPU's own matmul rate.

Builds the trainer core the trainer actor runs (same config path), feeds it synthetic buffers shaped
like ``bench_e2e.py --scale gpu`` (64 prompts x 8 responses, log-normal response lengths with
median 512 and max 4096), and times each step split into no-grad forwards and
forward+backward+optimizer. The limit measured in the same run is a large bf16 matmul: the
step's model FLOPs (2 per parameter and token for a forward, 6 for forward+backward, 2 more
where layers are recomputed) over its time, divided by that rate, is the fraction of the GPU the
step uses. Variants are override sets run back to back on the same buffers:

    python tools/bench_trainer.py --model /tmp/q05 --variants base,no_recompute --profile

Ends with ``RESULT <variant>_tok_s=... <variant>_vs_gemm=... ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import statistics
import time
from collections.abc import Iterator

import torch

from psrl.config import load_config
from psrl.log import configure
from psrl.rl.trajectory import Trajectory
from psrl.trainer.core import TrainerCore
from psrl.trainer.parallel import ParallelContext

BASE = [
    "actor.use_dynamic_bsz=True",
    "actor.ppo_max_token_len_per_gpu=16384",
    "actor.gradient_checkpointing=True",
    "actor.compute_dtype=bfloat16",
]
VARIANTS = {
    "base": [],
    "no_recompute": ["actor.gradient_checkpointing=False"],
    "no_recompute_8k": ["actor.gradient_checkpointing=False", "actor.ppo_max_token_len_per_gpu=8192"],
    "cudnn_attention": ["actor.gradient_checkpointing=False"],
}


def buffer(buffer_id: int, args: argparse.Namespace, vocab: int) -> list[Trajectory]:
    rng = random.Random(buffer_id)
    out = []
    for group in range(args.groups):
        prompt = tuple(rng.randrange(2, vocab) for _ in range(args.prompt_len))
        for child in range(args.group_size):
            length = min(args.max_len, max(1, int(rng.lognormvariate(math.log(args.median), args.sigma))))
            response = tuple(rng.randrange(2, vocab) for _ in range(length))
            out.append(Trajectory(prompt_id=buffer_id * 1000 + group, child=child, prompt_token_ids=prompt,
                                  response_token_ids=response, rollout_log_probs=tuple(-3.0 for _ in response),
                                  token_versions=tuple(buffer_id for _ in response), version=buffer_id,
                                  reward=float(child % 2), acc=0.0))  # fmt: skip
    return out


def gemm_tflops(device: torch.device, size: int, reps: int = 10) -> float:
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    a @ b  # warm-up
    synchronize(device)
    started = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(device)
    return 2 * size**3 * reps / (time.perf_counter() - started) / 1e12


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(name: str, args: argparse.Namespace, peak: float) -> dict[str, float]:
    device = torch.device(args.device)
    sizes = [f"psrl.staleness_buffer_entries={args.groups}", f"psrl.rollout_n={args.group_size}",
             f"actor.ppo_mini_batch_size={args.groups}"]  # fmt: skip
    config = load_config("demo", [*BASE, f"topology.device={device.type}", f"model.path={args.model}", *sizes,
                                  *VARIANTS[name]])  # fmt: skip
    core = TrainerCore(config, parallel=ParallelContext(device=device))
    # the trainer keeps SDPA off cuDNN (psrl.trainer.models.use_low_overhead_attention); this variant
    # measures what that saves
    torch.backends.cuda.enable_cudnn_sdp(name == "cudnn_attention")
    vocab = core.policy.raw.config.vocab_size
    params = sum(p.numel() for p in core.policy.raw.parameters())
    rows = []
    profile = args.profile and name == args.variants.split(",")[0]
    # step 0 warms up kernels and the allocator; a profiled step (the last) is not timed
    for step in range(args.steps + 1 + profile):
        trajectories = buffer(step, args, vocab)
        tokens = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in trajectories)
        is_profiled = profile and step == args.steps + 1
        synchronize(device)
        started = time.perf_counter()
        with profiled(is_profiled):
            result = core.train_buffer(step, trajectories)
        synchronize(device)
        seconds = time.perf_counter() - started
        if step and not is_profiled:
            rows.append({"s": seconds, "tokens": tokens, "forward_s": result.metrics["perf/forward_s"],
                         "update_s": result.metrics["perf/update_s"]})  # fmt: skip
    recompute = 2 if config.actor.gradient_checkpointing else 0
    flops_per_token = params * (2 + 6 + recompute)
    seconds = statistics.median(r["s"] for r in rows)
    tokens = statistics.median(r["tokens"] for r in rows)
    out = {"tok_s": tokens / seconds, "vs_gemm": flops_per_token * tokens / seconds / 1e12 / peak, "step_s": seconds,
           "forward_s": statistics.median(r["forward_s"] for r in rows),
           "update_s": statistics.median(r["update_s"] for r in rows),
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0}  # fmt: skip
    print(f"{name}: " + " ".join(f"{k}={v:.3f}" for k, v in out.items()), flush=True)
    del core
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return out


@contextlib.contextmanager
def profiled(enabled: bool) -> Iterator[None]:
    """torch.profiler around one step when asked; prints the operators that took the most time."""
    if not enabled:
        yield
        return
    on_gpu = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])
    with torch.profiler.profile(activities=activities) as profiler:
        yield
    sort_by = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    print(profiler.key_averages().table(sort_by=sort_by, row_limit=25, max_name_column_width=60), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face checkpoint directory (tools/random_model.py)")
    ap.add_argument("--variants", default="base,no_recompute", help=f"comma list of {sorted(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per variant (after one warm-up)")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--median", type=int, default=512)
    ap.add_argument("--sigma", type=float, default=0.8)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", action="store_true", help="profile the first variant's last step")
    args = ap.parse_args()
    configure("warning")
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:
        ap.error(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    size = 8192 if args.device == "cuda" else 1024
    peak = gemm_tflops(torch.device(args.device), size)
    print(f"bf16 matmul {size}^3: {peak:.1f} TFLOP/s", flush=True)
    results = {name: run_variant(name, args, peak) for name in args.variants.split(",")}
    print(f"RESULT gemm_tflops={peak:.0f} " + " ".join(
        f"{name}_tok_s={r['tok_s']:.0f} {name}_vs_gemm={r['vs_gemm']:.3f} {name}_step_s={r['step_s']:.2f}"
        for name, r in results.items()))  # fmt: skip


if __name__ == "__main__":
    main()
