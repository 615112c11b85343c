"""The embedded engine's decode throughput on a GPU against the memory-bandwidth roofline (bench_engine --roofline).

A decode step must read every weight once and the keys/values of every live position of every
sequence; at the HBM bandwidth measured in the same run (a device-to-device copy, bytes read plus
bytes written) that is the fastest a step can be. For each model shape (random bf16 weights made on
the GPU, published layer shapes and vocabularies), batch size and context length, B requests with
C-token prompts are started; their prefill is skipped (the KV cache holds random values, which cost
a decode step the same bytes), a few decode rounds warm up (graph capture), and `rounds` rounds are
timed through `Engine.step()`, host work included. The fraction is the roofline time of the bytes
those steps read over the measured time. Points whose KV does not fit the cache are skipped (how
the engine preempts under KV pressure is tests/engine/test_gpu.py's 256 x 8k test); a point that
preempts anyway is marked. One round per shape is profiled with the torch profiler and split
into attention, matrix products, norms/rotary/activation, sampling, other kernels, and the time the
GPU sat idle (launch gaps and host work between rounds).

`--e2e-batches` adds whole generations (real prefill of --prompt-len tokens, --gen-len tokens out)
with the step kernels against the torch path (engine.gpu_kernels=off) in the same run.
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from psrl.engine import Engine, EngineArgs, SamplingParams
from psrl.engine.scheduler import ScheduledBatch
from psrl.engine.sequence import Sequence
from psrl.models import ModelSpec, expected_weight_names
from psrl.models.shapes import BODIES, VOCABULARIES

BLOCK_SIZE = 16
RESERVE_BYTES = 8 << 30  # activations, logits, graph pools, allocator slack
CATEGORIES = {
    "attention": ("_decode_attention", "_merge_splits", "_prefill_attention", "attention", "fmha", "flash"),
    "matmul": ("gemm", "Gemm", "sm90", "cutlass", "nvjet", "xmma", "cublas", "splitK"),
    "norm_rotary_act": ("_add_rms_norm", "_rotary_kv", "_silu_mul", "_decode_slots", "rms_norm", "silu"),
    "sampling": ("_sample",),
}


@dataclass
class Point:
    batch: int
    context: int
    tok_s: float
    fraction: float
    step_ms: float
    gb_per_step: float
    preemptions: int


def measure_bandwidth(device: torch.device, num_bytes: int = 4 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + written), median of 10 copies."""
    source = torch.empty(num_bytes // 2, dtype=torch.int16, device=device).random_()
    target = torch.empty_like(source)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    del source, target
    return 2 * num_bytes / statistics.median(times[2:])


def write_config(shape: str, directory: Path, max_positions: int) -> ModelSpec:
    config = dict(BODIES[shape], **VOCABULARIES[shape], model_type="qwen2", max_position_embeddings=max_positions,
                  rms_norm_eps=1e-6, hidden_act="silu")  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    return ModelSpec.from_dir(directory)


def random_weights(spec: ModelSpec, device: torch.device, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a checkpoint of `spec`, drawn on the device in bf16 (norms 1, the rest N(0, 0.02))."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    for name in expected_weight_names(spec):
        shape = hf_shape(spec, name)
        if name.endswith("norm.weight"):
            yield name, torch.ones(shape, dtype=torch.bfloat16, device=device)
        else:
            tensor = torch.empty(shape, dtype=torch.bfloat16, device=device)
            yield name, tensor.normal_(0.0, 0.02, generator=generator)


def hf_shape(spec: ModelSpec, name: str) -> tuple[int, ...]:
    hidden, inter = spec.hidden_size, spec.intermediate_size
    sizes = {"q_proj": spec.q_size, "k_proj": spec.kv_size, "v_proj": spec.kv_size}
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (spec.vocab_size, hidden)
    if name.endswith("norm.weight"):
        return (hidden,)
    module = name.split(".")[-2]
    if name.endswith(".bias"):
        return (sizes.get(module, hidden),)
    rows = {**sizes, "o_proj": hidden, "gate_proj": inter, "up_proj": inter, "down_proj": hidden}[module]
    columns = {"o_proj": spec.q_size, "down_proj": inter}.get(module, hidden)
    return (rows, columns)


def make_engine(model_dir: Path, spec: ModelSpec, device: torch.device, shape_args: dict[str, object]) -> Engine:
    args = EngineArgs(model_path=model_dir, dtype="bfloat16", device=device.type, block_size=BLOCK_SIZE,
                      enable_prefix_caching=False, **shape_args)  # type: ignore[arg-type]  # fmt: skip
    return Engine(args, weights=random_weights(spec, device))


def kv_blocks_that_fit(spec: ModelSpec, wanted: int) -> int:
    if not torch.cuda.is_available():
        return wanted
    free, _ = torch.cuda.mem_get_info()
    weights = weight_bytes(spec) + spec.vocab_size * spec.hidden_size * 2  # the embedding table too
    per_block = spec.num_layers * BLOCK_SIZE * 2 * spec.num_kv_heads * spec.head_dim * 2
    return max(64, min(wanted, (free - weights - RESERVE_BYTES) // per_block))


def weight_bytes(spec: ModelSpec) -> int:
    """Bytes a decode step reads: every layer, the final norm and the LM head (embedding rows are negligible)."""
    hidden, inter = spec.hidden_size, spec.intermediate_size
    qkv = hidden * (spec.q_size + 2 * spec.kv_size) + (spec.q_size + 2 * spec.kv_size) * spec.has_qkv_bias
    layer = qkv + spec.q_size * hidden + 3 * hidden * inter + 2 * hidden
    return 2 * (spec.num_layers * layer + hidden + hidden * spec.vocab_size)


def kv_bytes_per_position(spec: ModelSpec) -> int:
    return spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 2


def skip_prefill(engine: Engine) -> None:
    """Prefill steps return zero logits without running the model: the KV cache keeps its random contents."""
    execute, vocab, device = engine.runner.execute, engine.spec.vocab_size, engine.device

    def without_prefill(batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        if not batch.is_prefill:
            return execute(batch)
        done = [seq for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
                if seq.num_computed_tokens + n == seq.num_tokens]  # fmt: skip
        return torch.zeros(len(done), vocab, device=device), done

    engine.runner.execute = without_prefill  # type: ignore[method-assign]


def start_requests(engine: Engine, batch: int, context: int, num_tokens: int, rng: random.Random) -> None:
    params = SamplingParams(max_tokens=num_tokens, min_tokens=num_tokens, ignore_eos=True, temperature=1.0)
    generator = torch.Generator().manual_seed(rng.randrange(1 << 30))
    prompts = torch.randint(0, engine.spec.vocab_size, (batch, context), generator=generator).tolist()
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, params)
    while engine.scheduler.waiting or any(seq.is_prefilling for seq in engine.scheduler.running):
        engine.step()


def decode_point(engine: Engine, batch: int, context: int, rounds: tuple[int, int], bandwidth: float) -> Point:
    """Warm up, then time `rounds[1]` decode rounds of `batch` sequences at `context` tokens."""
    warm, timed = rounds
    steps_per_round = engine.args.decode_steps if engine.runner.rounds is not None else 1
    preempted_before = engine.status().num_preemptions_total
    start_requests(engine, batch, context, 2 + (warm + timed + 1) * steps_per_round, random.Random(batch + context))
    for _ in range(warm):
        engine.step()
    _release()
    num_tokens = num_steps = kv_positions = 0
    started = time.perf_counter()
    for _ in range(timed):
        lengths = {seq.request_id: seq.num_tokens for seq in engine.scheduler.running}
        out = engine.step()
        counts = [len(output.token_ids) for output in out.outputs]
        num_tokens += sum(counts)
        num_steps += max(counts, default=0)
        for output, count in zip(out.outputs, counts, strict=True):
            kv_positions += count * lengths[output.request_id] + count * (count - 1) // 2
    _synchronize()
    elapsed = time.perf_counter() - started
    engine.abort_all()
    spec = engine.spec
    read = num_steps * weight_bytes(spec) + kv_positions * kv_bytes_per_position(spec)
    return Point(batch, context, num_tokens / elapsed, read / bandwidth / elapsed, 1000 * elapsed / max(num_steps, 1),
                 read / max(num_steps, 1) / 1e9, engine.status().num_preemptions_total - preempted_before)  # fmt: skip


def profile_round(engine: Engine, batch: int, context: int) -> dict[str, float]:
    """Milliseconds per decode step by kernel category, plus the GPU's idle time, over one profiled round."""
    from torch.profiler import ProfilerActivity, profile

    steps = engine.args.decode_steps if engine.runner.rounds is not None else 1
    start_requests(engine, batch, context, 2 + 4 * steps, random.Random(7))
    for _ in range(2):
        engine.step()
    _release()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        engine.step()
        _synchronize()
        wall_ms = (time.perf_counter() - started) * 1000
    engine.abort_all()
    split = dict.fromkeys([*CATEGORIES, "other"], 0.0)
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA or "Memcpy" in event.name or "Memset" in event.name:
            continue
        category = next((c for c, keys in CATEGORIES.items() if any(k in event.name for k in keys)), "other")
        split[category] += event.time_range.elapsed_us() / 1000
    busy = sum(split.values())
    split["gpu_idle"] = max(0.0, wall_ms - busy)
    return {name: value / steps for name, value in split.items()}


def e2e_tok_s(engine: Engine, batch: int, prompt_len: int, gen_len: int) -> float:
    """Whole generations, prefill included: generated tokens per second (second of two runs)."""
    rate = 0.0
    for attempt in range(2):
        rng = random.Random(attempt)
        params = SamplingParams(max_tokens=gen_len, min_tokens=gen_len, ignore_eos=True, temperature=1.0)
        vocab = engine.spec.vocab_size
        for index in range(batch):
            engine.add_request(f"e{attempt}-{index}", [rng.randrange(vocab) for _ in range(prompt_len)], params)
        _release()
        started, num_tokens = time.perf_counter(), 0
        while engine.has_unfinished_requests():
            num_tokens += sum(len(result.output_ids) for result in engine.step().finished)
        _synchronize()
        rate = num_tokens / (time.perf_counter() - started)
    return rate


def run_shape(shape: str, args: object, device: torch.device, bandwidth: float, directory: Path) -> list[str]:
    """The grid of one shape (and its e2e comparison); prints rows as they finish, returns RESULT fields."""
    batches, contexts = args.batches, args.contexts  # type: ignore[attr-defined]
    warm, timed = args.rounds  # type: ignore[attr-defined]
    steps = args.decode_steps  # type: ignore[attr-defined]
    max_len = max(contexts) + 2 + (warm + timed + 4) * steps + BLOCK_SIZE
    spec = write_config(shape, directory, max_len)
    wanted = max(batches) * ((max_len + BLOCK_SIZE - 1) // BLOCK_SIZE)
    blocks = kv_blocks_that_fit(spec, wanted)
    engine = make_engine(directory, spec, device, dict(
        num_kv_blocks=blocks, max_num_seqs=max(batches), max_num_batched_tokens=max(batches) * max_len,
        max_model_len=max_len, decode_steps=steps))  # fmt: skip
    skip_prefill(engine)
    print(f"\n{shape}: {weight_bytes(spec) / 1e9:.2f} GB of weights per step, "
          f"{kv_bytes_per_position(spec) / 1024:.1f} KiB of KV per position, {blocks} KV blocks "
          f"({blocks * BLOCK_SIZE} positions), decode={engine.runner.decode_path} steps/round={steps}")  # fmt: skip
    print(f"{'batch':>5} {'context':>7} {'tok/s':>10} {'step ms':>8} {'GB/step':>8} {'roofline':>8}  note", flush=True)
    fields, points = [f"shape={shape}"], []
    for batch in batches:
        for context in contexts:
            needed = batch * -(-(context + 2 + (warm + timed + 1) * steps) // BLOCK_SIZE)
            if needed > blocks:
                print(f"{batch:>5} {context:>7}  skipped: needs {needed} KV blocks, the cache holds {blocks}")
                continue
            point = decode_point(engine, batch, context, (warm, timed), bandwidth)
            points.append(point)
            note = f"preempted {point.preemptions}" if point.preemptions else ""
            print(f"{batch:>5} {context:>7} {point.tok_s:>10.0f} {point.step_ms:>8.2f} {point.gb_per_step:>8.2f} "
                  f"{point.fraction:>8.3f}  {note}", flush=True)  # fmt: skip
            fields += [f"roofline_fraction_b{batch}_c{context}={point.fraction:.3f}",
                       f"tok_s_b{batch}_c{context}={point.tok_s:.0f}"]  # fmt: skip
    for batch in (64, 256):
        clean = [p for p in points if p.batch == batch and not p.preemptions]
        if clean:
            fields.insert(1, f"roofline_fraction_b{batch}={min(p.fraction for p in clean):.3f}")
    clean_256 = [p for p in points if p.batch == 256 and not p.preemptions]
    if clean_256:
        fields.insert(3, f"tok_s_b256={min(p.tok_s for p in clean_256):.0f}")
    profile_batch = 64 if 64 in batches else batches[0]
    split = profile_round(engine, profile_batch, 2048 if 2048 in contexts else contexts[0])
    print("one step, ms: " + " ".join(f"{name}={value:.3f}" for name, value in split.items()), flush=True)
    fields += [f"profile_{name}_ms={value:.3f}" for name, value in split.items()]
    del engine
    _release()
    if shape in args.e2e_shapes:  # type: ignore[attr-defined]
        fields += e2e_comparison(shape, args, device, directory)
    return fields


def e2e_comparison(shape: str, args: object, device: torch.device, directory: Path) -> list[str]:
    """Whole generations with the step kernels against the torch path (gpu_kernels=off), same weights."""
    prompt_len, gen_len = args.prompt_len, args.gen_len  # type: ignore[attr-defined]
    spec = write_config(shape, directory, prompt_len + gen_len + BLOCK_SIZE)
    fields: list[str] = []
    print(f"{shape} whole generations ({prompt_len} prompt + {gen_len} generated tokens), tok/s:")
    for batch in args.e2e_batches:  # type: ignore[attr-defined]
        rates = {}
        for kernels in ("auto", "off"):
            engine = make_engine(directory, spec, device, dict(
                num_kv_blocks=batch * ((prompt_len + gen_len) // BLOCK_SIZE + 2) + 8, max_num_seqs=batch,
                max_num_batched_tokens=max(2048, prompt_len), gpu_kernels=kernels,
                decode_steps=args.decode_steps))  # type: ignore[attr-defined]  # fmt: skip
            rates[kernels] = e2e_tok_s(engine, batch, prompt_len, gen_len)
            if batch == args.e2e_batches[0]:  # type: ignore[attr-defined]
                split = profile_round(engine, batch, prompt_len)
                print(f"  one step at batch {batch}, gpu_kernels={kernels}, ms: "
                      + " ".join(f"{name}={value:.3f}" for name, value in split.items()), flush=True)  # fmt: skip
                fields += [f"e2e_profile_{kernels}_{name}_ms={value:.3f}" for name, value in split.items()]
            del engine
            _release()
        ratio = rates["auto"] / rates["off"]
        print(f"  batch {batch}: kernels {rates['auto']:.0f}, torch path {rates['off']:.0f} ({ratio:.2f}x)", flush=True)
        fields += [f"e2e_tok_s_b{batch}={rates['auto']:.0f}", f"e2e_baseline_tok_s_b{batch}={rates['off']:.0f}",
                   f"e2e_vs_baseline_b{batch}={ratio:.2f}"]  # fmt: skip
    return fields


def _synchronize() -> None:
    """Wait for the device; nothing else, since the callers time what follows or precedes it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _release() -> None:
    """Free a dropped engine's memory (outside every timed region: a full collection takes 100+ ms)."""
    gc.collect()  # an engine patched by skip_prefill is a reference cycle: free its KV cache now
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
