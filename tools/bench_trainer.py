"""The trainer step alone on the real-scale workload, against the device's own matmul rate.

Builds the trainer core the trainer actor runs (same config path), feeds it synthetic buffers shaped
like ``bench_e2e.py --scale gpu`` (64 prompts x 8 responses, log-normal response lengths with
median 512 and max 4096), and times each step split into no-grad forwards and
forward+backward+optimizer. The limit measured in the same run is a large matmul (bf16 on a GPU,
float32 on a CPU). The step's model FLOPs over its time, divided by that rate, is the fraction of
the device the step uses (``vs_gemm``). Model FLOPs count real tokens only (padding never counts):
2 per parameter and token for each no-grad forward (old log-probs, reference log-probs, values), 6
for forward+backward; layers recomputed under checkpointing do not count again. The input
embedding is a lookup, not a matmul, so it counts only where it is also the LM head (tied).
Attention's own FLOPs (causal: 2 x layers x heads x head_dim x length^2 per forward, 3x that for
forward+backward) are reported apart (``attn_vs_gemm``).

The model: ``--model DIR``, or ``--shape`` (a random checkpoint with a published model's layers and
the demo tokenizer, see tools/random_model.py, written to a temporary directory; ``demo`` is the
bundled demo model). Variants are override sets run back to back on the same buffers; ``default``
is the trainer's default configuration (packed micro-batches, checkpointing by memory budget):

    python tools/bench_trainer.py --shape qwen2.5-0.5b --variants default,padded --profile

Ends with ``RESULT shape=<shape> gemm_tflops=... best_vs_gemm=<default's vs_gemm> <variant>_tok_s=...
<variant>_response_tok_s=... <variant>_vs_gemm=... <variant>_attn_vs_gemm=... <variant>_step_s=...
default_vs_padded=...``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import random
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from psrl.config import Config, load_config
from psrl.engine import DEMO_MODEL_DIR
from psrl.log import configure
from psrl.models.shapes import BODIES
from psrl.rl.trajectory import Trajectory
from psrl.trainer.core import TrainerCore
from psrl.trainer.parallel import ParallelContext

BASE = ["actor.use_dynamic_bsz=True", "actor.ppo_max_token_len_per_gpu=16384"]
VARIANTS = {
    "default": [],
    "padded": ["actor.packing=False"],
    "shared": ["actor.share_prompts=True"],  # each group's prompt once per micro-batch (the CPU default)
    "unshared": ["actor.share_prompts=False"],
    "eager": ["actor.compile=False"],
    "recompute": ["actor.gradient_checkpointing=True"],
    "no_recompute": ["actor.gradient_checkpointing=False"],
    "no_recompute_8k": ["actor.gradient_checkpointing=False", "actor.ppo_max_token_len_per_gpu=8192"],
    "cudnn_attention": ["actor.packing=False", "actor.gradient_checkpointing=False"],
}
SHAPES = ["demo", *sorted(BODIES)]


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
    """The matmul rate of the dtype the step computes in: bf16 on a GPU, float32 on a CPU."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
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


def variant_config(name: str, args: argparse.Namespace, device: torch.device) -> Config:
    """The demo preset with the buffer's sizes; one mini-batch a buffer and token-budgeted micro-batches
    (`BASE`) unless `--demo-batching` keeps the demo's own (4 groups a step, 32 samples a micro-batch)."""
    sizes = [f"psrl.staleness_buffer_entries={args.groups}", f"psrl.rollout_n={args.group_size}"]
    batching = [] if args.demo_batching else [*BASE, f"actor.ppo_mini_batch_size={args.groups}"]
    dtype = "bfloat16" if device.type == "cuda" else "float32"  # CPU autocast to bf16 is slower than float32
    return load_config("demo", [*batching, f"actor.compute_dtype={dtype}", f"topology.device={device.type}",
                                f"model.path={args.model}", *sizes, *VARIANTS[name], *args.set])  # fmt: skip


def model_flops(core: TrainerCore, trajectories: list[Trajectory]) -> tuple[float, float]:
    """(model FLOPs, attention FLOPs) of one step on these trajectories (see the module docstring)."""
    raw = core.policy.raw
    config = raw.config
    params = sum(p.numel() for p in raw.parameters())
    if not config.tie_word_embeddings:
        params -= raw.get_input_embeddings().weight.numel()
    tokens = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in trajectories)
    squares = sum((len(t.prompt_token_ids) + len(t.response_token_ids)) ** 2 for t in trajectories)
    forwards = 1 + (core.reference is not None) + (core.critic is not None)  # no-grad forwards per sample
    updates = 1 + (core.critic is not None)  # forward+backward per sample
    head_dim = config.hidden_size // config.num_attention_heads
    attention_per_forward = 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * squares
    model = params * tokens * (2 * forwards + 6 * updates)
    return float(model), float(attention_per_forward * (forwards + 3 * updates))


def timed_step(core: TrainerCore, step: int, args: argparse.Namespace, *, profile: bool) -> dict[str, float]:
    device = core.parallel.device
    trajectories = buffer(step, args, core.policy.raw.config.vocab_size)
    synchronize(device)
    started = time.perf_counter()
    with profiled(profile):
        result = core.train_buffer(step, trajectories)
    synchronize(device)
    seconds = time.perf_counter() - started
    flops, attention = model_flops(core, trajectories)
    tokens = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in trajectories)
    response_tokens = sum(len(t.response_token_ids) for t in trajectories)
    return {"s": seconds, "tokens": tokens, "response_tokens": response_tokens, "flops": flops, "attention": attention,
            "forward_s": result.metrics["perf/forward_s"], "update_s": result.metrics["perf/update_s"]}  # fmt: skip


def summary(name: str, rows: list[dict[str, float]], peak: float, peak_gib: float) -> dict[str, float]:
    out = {"tok_s": statistics.median(r["tokens"] / r["s"] for r in rows),
           "response_tok_s": statistics.median(r["response_tokens"] / r["s"] for r in rows),
           "vs_gemm": statistics.median(r["flops"] / r["s"] for r in rows) / 1e12 / peak,
           "attn_vs_gemm": statistics.median(r["attention"] / r["s"] for r in rows) / 1e12 / peak,
           "step_s": statistics.median(r["s"] for r in rows),
           "forward_s": statistics.median(r["forward_s"] for r in rows),
           "update_s": statistics.median(r["update_s"] for r in rows),
           "peak_gib": peak_gib}  # fmt: skip
    print(f"{name}: " + " ".join(f"{k}={v:.3f}" for k, v in out.items()), flush=True)
    return out


def new_core(name: str, args: argparse.Namespace) -> TrainerCore:
    device = torch.device(args.device)
    return TrainerCore(variant_config(name, args, device), parallel=ParallelContext(device=device))


def run_variant(name: str, args: argparse.Namespace, peak: float) -> dict[str, float]:
    """One variant alone: its own core, warm-up step, measured steps (and its peak GPU memory)."""
    core = new_core(name, args)
    device = core.parallel.device
    # the trainer keeps SDPA off cuDNN (psrl.trainer.models.use_low_overhead_attention); this variant
    # measures what that saves
    torch.backends.cuda.enable_cudnn_sdp(name == "cudnn_attention")
    profile = args.profile and name == args.variants.split(",")[0]
    # step 0 warms up kernels and the allocator; a profiled step (the last) is not timed
    rows = [timed_step(core, step, args, profile=False) for step in range(args.steps + 1)][1:]
    if profile:
        timed_step(core, args.steps + 1, args, profile=True)
    if args.cprofile and name == args.variants.split(",")[0]:
        python_profile(core, args.steps + 1 + profile, args)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    del core
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return summary(name, rows, peak, peak_gib)


def run_interleaved(names: list[str], args: argparse.Namespace, peak: float) -> dict[str, dict[str, float]]:
    """Every variant's core at once, one step of each in turn: on a loaded machine the variants see the
    same load, so their ratio holds even where absolute times do not."""
    cores = {name: new_core(name, args) for name in names}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for step in range(args.steps + 1):
        for name, core in cores.items():
            torch.backends.cuda.enable_cudnn_sdp(name == "cudnn_attention")
            row = timed_step(core, step, args, profile=args.profile and step == args.steps and name == names[0])
            if step:
                rows[name].append(row)
    return {name: summary(name, rows[name], peak, 0.0) for name in names}


def model_dir(args: argparse.Namespace, scratch: Path) -> Path:
    """`--model`, the bundled demo model, or a random checkpoint of `--shape` written under `scratch`."""
    if args.model:
        return Path(args.model)
    if args.shape == "demo":
        return Path(DEMO_MODEL_DIR)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root
    from tools.random_model import write_model

    write_model(args.shape, scratch / args.shape, max_positions=max(8192, args.prompt_len + args.max_len))
    return scratch / args.shape


def python_profile(core: TrainerCore, step: int, args: argparse.Namespace) -> None:
    """One more step under cProfile: where the host's time goes by Python function (on a GPU, time spent
    waiting for the device shows up at the call that synchronised)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    timed_step(core, step, args, profile=False)
    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


@contextlib.contextmanager
def profiled(enabled: bool) -> Iterator[None]:
    """torch.profiler around one step when asked; prints the operators that took the most time, and on
    a GPU the CUDA runtime calls by host time and the code that made the host wait for the device."""
    if not enabled:
        yield
        return
    on_gpu = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])
    with torch.profiler.profile(activities=activities) as profiler, host_waits(on_gpu) as sites:
        yield
    sort_by = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    averages = profiler.key_averages()
    print(averages.table(sort_by=sort_by, row_limit=25, max_name_column_width=60), flush=True)
    if on_gpu:  # the host's side: which operators and wrappers hold the launching thread
        print(averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60), flush=True)
        runtime = sorted((e for e in averages if e.key.startswith("cuda")), key=lambda e: -e.self_cpu_time_total)
        for event in runtime[:8]:
            print(f"runtime {event.key}: {event.count} calls, {event.self_cpu_time_total / 1e3:.1f} ms host")
        for site, count in sites.most_common(12):
            print(f"host wait x{count}: {site}")


@contextlib.contextmanager
def host_waits(enabled: bool) -> Iterator[collections.Counter[str]]:
    """Count the psrl call sites of operations that synchronise the host with the device (torch's sync
    debug mode warns at each; the innermost psrl frame names the site)."""
    sites: collections.Counter[str] = collections.Counter()
    if not enabled:
        yield sites
        return

    def record(message: object, *rest: object, **kwargs: object) -> None:
        if "synchroniz" not in str(message):  # any other warning is shown as usual
            previous(message, *rest, **kwargs)  # type: ignore[arg-type]
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "/psrl/" in f.filename or "/tools/" in f.filename]
        inner = frames[-1] if frames else None
        sites[f"{'/'.join(inner.filename.rsplit('/', 2)[-2:])}:{inner.lineno} {inner.name}" if inner else "?"] += 1

    previous = warnings.showwarning
    with warnings.catch_warnings():  # restores showwarning and the filters on exit
        warnings.simplefilter("always")
        warnings.showwarning = record  # type: ignore[assignment]
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode("default")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a Hugging Face checkpoint directory (else --shape)")
    ap.add_argument(
        "--shape", choices=SHAPES, default="qwen2.5-0.5b", help="the model's layers (with --model: a label)"
    )
    ap.add_argument("--variants", default="default,padded", help=f"comma list of {sorted(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per variant (after one warm-up)")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--median", type=int, default=512)
    ap.add_argument("--sigma", type=float, default=0.8)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", action="store_true", help="profile the first variant's last step")
    ap.add_argument("--demo-batching", action="store_true", help="the demo's mini- and micro-batches (CPU demo step)")
    ap.add_argument("--interleave", action="store_true", help="alternate the variants step by step (loaded machines)")
    ap.add_argument("--cprofile", action="store_true", help="one more step of the first variant under cProfile")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every variant (repeatable): actor.ppo_mini_batch_size=16")  # fmt: skip
    args = ap.parse_args()
    configure("warning")
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        ap.error(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    size = 8192 if args.device == "cuda" else 1024
    peak = gemm_tflops(torch.device(args.device), size)
    print(f"matmul {size}^3: {peak:.3f} TFLOP/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as scratch:
        args.model = str(model_dir(args, Path(scratch)))
        if args.interleave:
            results = run_interleaved(names, args, peak)
        else:
            results = {name: run_variant(name, args, peak) for name in names}
    best = results.get("default", max(results.values(), key=lambda r: r["vs_gemm"]))
    extra = f" default_vs_padded={results['padded']['step_s'] / results['default']['step_s']:.2f}" if {
        "default", "padded"} <= set(results) else ""  # fmt: skip
    print(f"RESULT shape={args.shape} gemm_tflops={peak:.3f} best_vs_gemm={best['vs_gemm']:.4f} " + " ".join(
        f"{name}_tok_s={r['tok_s']:.0f} {name}_response_tok_s={r['response_tok_s']:.0f} "
        f"{name}_vs_gemm={r['vs_gemm']:.4f} {name}_attn_vs_gemm={r['attn_vs_gemm']:.4f} "
        f"{name}_step_s={r['step_s']:.3f}" for name, r in results.items()) + extra)  # fmt: skip


if __name__ == "__main__":
    main()
