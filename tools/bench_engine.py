"""psrl's embedded engine against transformers `generate`, or against vLLM, on the same model and prompts.

For each batch size, both generate exactly --gen-len tokens per sequence (sampling at temperature
1, no top-k/top-p; the engine uses min_tokens/ignore_eos, transformers min_new_tokens) from the
same random prompts of --prompt-len tokens. Tokens/s counts generated tokens over the whole call
(prefill included); each figure is the median of --repeats runs, contenders interleaved. On CUDA
it also reports the fraction of the weights-only memory-bandwidth roofline (every decode step
reads all weights once, so tok/s <= batch * bandwidth / weight bytes). --compare-eager adds the
engine's eager decode path: without CUDA graphs on CUDA, without the fused C kernels on a CPU.
--backend both times the vLLM backend (the vllm extra) instead of transformers, back to back with
the embedded engine, with the same dtype, threads and sampling; vLLM runs its KV cache in blocks of
32 tokens (what its CPU attention needs), the embedded engine in blocks of 16.

    .venv/bin/python tools/bench_engine.py --compare-eager       # the demo model, CPU
    .venv/bin/python tools/bench_engine.py --model ~/.cache/psrl/models/SmolLM2-135M-Instruct
    python tools/bench_engine.py --random-init qwen2.5-0.5b --device cuda --dtype bfloat16 --compare-eager

    .venv-vllm/bin/python tools/bench_engine.py --backend both --model ~/.cache/psrl/models/SmolLM2-135M-Instruct
    # on a shared 2-core box (about 14 minutes; docs/benchmarks.md):
    OMP_NUM_THREADS=1 .venv-vllm/bin/python tools/bench_engine.py --backend both \
        --model ~/.cache/psrl/models/SmolLM2-135M-Instruct --gen-len 64 --repeats 2 --threads 1

The last line is `RESULT engine_vs_hf_b32=<ratio> ...` (with --backend both: `RESULT embedded_vs_vllm_b32=...`).

--roofline (CUDA) measures decode throughput per model shape, batch size and context length against
the weights + live-KV bandwidth roofline instead (tools/engine_roofline.py says how), with a profile
split per shape and whole generations against the engine's torch path; one `RESULT shape=...` line
per shape:

    python3 tools/bench_engine.py --roofline --shapes qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b \
        --batches 1,32,64,256,512 --contexts 512,2048,8192 --e2e-shapes qwen2.5-0.5b
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from psrl.engine import DEMO_MODEL_DIR, Engine, EngineArgs, RolloutEngine, SamplingParams
from psrl.models.shapes import BODIES

RANDOM_INIT_SHAPES = {
    # Qwen2.5-0.5B: 494 M parameters
    "qwen2.5-0.5b": dict(
        **BODIES["qwen2.5-0.5b"], vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True
    ),
    # for a quick end-to-end check of this script
    "qwen2-tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    ),
}


def load_reference(args: argparse.Namespace, model_dir: Path) -> PreTrainedModel:
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    if args.random_init:
        torch.manual_seed(0)
        config = Qwen2Config(**RANDOM_INIT_SHAPES[args.random_init], eos_token_id=None)
        config.save_pretrained(model_dir)
        return AutoModelForCausalLM.from_config(config).to(device=args.device, dtype=dtype).eval()
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()


def make_engine(
    args: argparse.Namespace, model_dir: Path, reference: PreTrainedModel, batch: int, eager: bool = False
) -> Engine:
    block_size = 16
    max_len = args.prompt_len + args.gen_len
    engine_args = EngineArgs(
        model_path=model_dir,
        dtype=args.dtype,
        device=args.device,
        block_size=block_size,
        num_kv_blocks=batch * ((max_len + block_size - 1) // block_size) + 8,
        max_num_seqs=batch,
        max_num_batched_tokens=max(2048, args.prompt_len),
        enable_prefix_caching=False,
        cuda_graphs=not eager,
        cpu_kernels="off" if eager else "auto",
    )
    return Engine(engine_args, weights=reference.state_dict())


def run_hf(model: PreTrainedModel, prompts: list[list[int]], gen_len: int, device: str) -> int:
    with torch.no_grad():
        out = model.generate(
            torch.tensor(prompts, device=device),
            attention_mask=torch.ones(len(prompts), len(prompts[0]), dtype=torch.long, device=device),
            max_new_tokens=gen_len,
            min_new_tokens=gen_len,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            pad_token_id=0,
        )
    return (out.shape[1] - len(prompts[0])) * len(prompts)


def make_vllm(args: argparse.Namespace, model_dir: Path, max_batch: int) -> RolloutEngine:
    """One vLLM engine for every batch size (it takes tens of seconds to start)."""
    from psrl.engine.vllm_backend import VllmEngine, VllmEngineArgs

    block_size = 32
    blocks_per_seq = (args.prompt_len + args.gen_len + block_size - 1) // block_size
    return VllmEngine(VllmEngineArgs(
        model_path=model_dir, dtype=args.dtype, device=args.device, block_size=block_size,
        num_kv_blocks=max_batch * blocks_per_seq + 8, max_num_seqs=max_batch,
        max_num_batched_tokens=max(2048, args.prompt_len), enable_prefix_caching=False, cuda_graphs=True,
    ))  # fmt: skip


def run_engine(engine: RolloutEngine, prompts: list[list[int]], gen_len: int) -> int:
    params = SamplingParams(max_tokens=gen_len, min_tokens=gen_len, ignore_eos=True, temperature=1.0)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params)
    num_tokens = 0
    while engine.has_unfinished_requests():
        num_tokens += sum(len(result.output_ids) for result in engine.step().finished)
    return num_tokens


def timed(function: Callable[[], int], device: str) -> float:
    """Tokens per second of one call."""
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    num_tokens = function()
    if device == "cuda":
        torch.cuda.synchronize()
    return num_tokens / (time.perf_counter() - started)


def bench_batch(
    args: argparse.Namespace, model_dir: Path, reference: PreTrainedModel, batch: int, vllm: RolloutEngine | None
) -> dict[str, float]:
    """Median tokens/s of each contender: engine, the baseline (hf or vllm) and, with --compare-eager, engine_eager."""
    rng = random.Random(batch)
    vocab = reference.config.vocab_size
    prompts = [[rng.randrange(1, vocab) for _ in range(args.prompt_len)] for _ in range(batch)]
    contenders: dict[str, Callable[[], int]] = {}
    engine = make_engine(args, model_dir, reference, batch)
    contenders["engine"] = lambda: run_engine(engine, prompts, args.gen_len)
    if args.compare_eager:
        eager = make_engine(args, model_dir, reference, batch, eager=True)
        contenders["engine_eager"] = lambda: run_engine(eager, prompts, args.gen_len)
    if vllm is None:
        contenders["hf"] = lambda: run_hf(reference, prompts, args.gen_len, args.device)
    else:
        contenders["vllm"] = lambda: run_engine(vllm, prompts, args.gen_len)
    for run in contenders.values():  # warm-up: first calls, and graph captures for the shapes used
        run()
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, run in contenders.items():
            rates[name].append(timed(run, args.device))
    return {name: statistics.median(values) for name, values in rates.items()}


def weight_bytes(model: PreTrainedModel) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def print_header(args: argparse.Namespace, contenders: list[str]) -> None:
    name = args.random_init or args.model.name
    print(f"model={name} device={args.device} dtype={args.dtype} threads={args.threads} "
          f"prompt_len={args.prompt_len} gen_len={args.gen_len} repeats={args.repeats} (median tok/s)")  # fmt: skip
    base = contenders[-1]
    columns = [*contenders, f"engine/{base}"] + ([f"eager/{base}"] if "engine_eager" in contenders else [])
    columns += ["roofline"] if args.device == "cuda" else []
    print(f"{'batch':>5} " + " ".join(f"{column:>13}" for column in columns), flush=True)


def report_row(args: argparse.Namespace, batch: int, rates: dict[str, float], num_weight_bytes: int) -> list[str]:
    """Print one table row as soon as its batch is done; returns its RESULT fields."""
    base = "vllm" if "vllm" in rates else "hf"
    ratio = rates["engine"] / rates[base]
    cells = [f"{rate:>13.1f}" for rate in rates.values()] + [f"{ratio:>13.2f}"]
    fields = [f"{ratio_key(base)}_b{batch}={ratio:.2f}"] + [f"{c}_tok_s_b{batch}={r:.1f}" for c, r in rates.items()]
    if "engine_eager" in rates:
        eager_ratio = rates["engine_eager"] / rates[base]
        cells.append(f"{eager_ratio:>13.2f}")
        fields.append(f"eager_vs_{base}_b{batch}={eager_ratio:.2f}")
    if args.device == "cuda":
        fraction = rates["engine"] / (batch * args.bandwidth_tb_s * 1e12 / num_weight_bytes)
        cells.append(f"{fraction:>13.3f}")
        fields.append(f"roofline_fraction_b{batch}={fraction:.3f}")
    print(f"{batch:>5} " + " ".join(cells), flush=True)
    return fields


def ratio_key(base: str) -> str:
    return "embedded_vs_vllm" if base == "vllm" else "engine_vs_hf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEMO_MODEL_DIR)
    parser.add_argument("--random-init", choices=sorted(RANDOM_INIT_SHAPES))
    parser.add_argument("--batches", help="comma-separated (default 1,8,32,64; with --roofline 1,32,64,256,512)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bandwidth-tb-s", type=float, default=4.0, help="HBM bandwidth for the roofline (CUDA)")
    parser.add_argument(
        "--compare-eager", action="store_true", help="also time the eager engine (no CUDA graphs / no CPU kernels)"
    )
    parser.add_argument(
        "--backend", default="embedded", choices=["embedded", "both"],
        help="both: the embedded engine against vLLM (the vllm extra) instead of transformers",
    )  # fmt: skip
    add_roofline_arguments(parser)
    args = parser.parse_args()
    args.batches = args.batches or ("1,32,64,256,512" if args.roofline else "1,8,32,64")
    torch.set_num_threads(args.threads)  # before vLLM starts: its CPU worker keeps the count it finds
    if args.roofline:
        roofline_main(args)
        return
    batches = [int(batch) for batch in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) if args.random_init else args.model
        reference = load_reference(args, model_dir)
        vllm = None
        if args.backend == "both":
            if args.random_init:
                reference.save_pretrained(model_dir)  # vLLM loads its weights from disk
            vllm = make_vllm(args, model_dir, max(batches))
        base = "hf" if vllm is None else "vllm"
        contenders = ["engine"] + (["engine_eager"] if args.compare_eager else []) + [base]
        print_header(args, contenders)
        fields: list[str] = []
        for batch in batches:
            rates = bench_batch(args, model_dir, reference, batch, vllm)
            fields += report_row(args, batch, rates, weight_bytes(reference))
    key = [field for field in fields if field.startswith(f"{ratio_key(base)}_b32=")]
    print("RESULT " + " ".join(key + [field for field in fields if field not in key]))


def add_roofline_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--roofline (CUDA): decode against the bandwidth roofline")
    group.add_argument("--roofline", action="store_true")
    group.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b")
    group.add_argument("--contexts", default="512,2048,8192")
    group.add_argument("--rounds", default="2,4", help="warm-up and timed decode rounds per point")
    group.add_argument("--decode-steps", type=int, default=16, help="decode steps per round (engine.decode_steps)")
    group.add_argument("--e2e-shapes", default="qwen2.5-0.5b", help="shapes that also run whole generations")
    group.add_argument("--e2e-batches", default="64,256")


def roofline_main(args: argparse.Namespace) -> None:
    from engine_roofline import measure_bandwidth, run_shape

    device = torch.device("cuda")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.rounds = tuple(int(r) for r in args.rounds.split(","))
    args.e2e_shapes = [s for s in args.e2e_shapes.split(",") if s]
    args.e2e_batches = [int(b) for b in args.e2e_batches.split(",")]
    bandwidth = measure_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}: device-to-device copy {bandwidth / 1e12:.2f} TB/s "
          f"(read + written), the roofline's bandwidth", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        for shape in args.shapes.split(","):
            fields = run_shape(shape, args, device, bandwidth, Path(scratch))
            print("RESULT " + " ".join([*fields, f"bandwidth_tb_s={bandwidth / 1e12:.2f}"]), flush=True)


if __name__ == "__main__":
    main()
