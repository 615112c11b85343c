"""Colocated training and rollout on one GPU with torch-memory-saver: switch latency, memory freed
against held, and an end-to-end colocated run next to the shared layout on the same workload.

switch   a trainer (a real model body, its optimizer state after one step) and an engine whose KV
         cache takes the memory the paused trainer leaves, in one process: both cannot be resident
         at once. Each cycle: rollout pauses, the trainer resumes and steps; the trainer pauses,
         rollout resumes and generates (greedy tokens must equal the first cycle's). Per side and
         region: pause and resume times and the bytes freed (cudaMemGetInfo).
e2e      the in-process driver (real flows, engine, trainer; one instance) on the same workload:
         shared (both resident on the GPU) and colocated (psrl.tms.range=all), trajectories/s each.

    python tools/bench_tms.py                       # one H200: qwen2.5-1.5b body, about 3 minutes
    python tools/bench_tms.py --shape qwen2.5-0.5b --skip-e2e

Ends with ``RESULT switch_ms=... to_train_ms=... to_rollout_ms=... freed_gib=... needs_gib=...
device_gib=... colocated_vs_shared=...``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.config import load_config
from psrl.engine import Engine, EngineArgs, SamplingParams
from psrl.flows.driver import InProcessRun
from psrl.rl.trajectory import Trajectory
from psrl.tms import ROLLOUT, TRAINER, SideMemory, SwitchReport, managed_regions
from psrl.tms.backend import TorchMemorySaverBackend, hook_mode, is_preloaded
from psrl.trainer import ParallelContext, TrainerCore
from tools.random_model import write_model

GIB = 2**30
GROUPS, GROUP_SIZE, PROMPT_LEN, RESPONSE_LEN = 8, 4, 64, 192


def used_bytes() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def trajectories(buffer_id: int, vocab: int) -> list[Trajectory]:
    rng = random.Random(buffer_id)
    out = []
    for group in range(GROUPS):
        prompt = tuple(rng.randrange(3, vocab) for _ in range(PROMPT_LEN))
        for child in range(GROUP_SIZE):
            response = tuple(rng.randrange(3, vocab) for _ in range(RESPONSE_LEN))
            out.append(Trajectory(prompt_id=buffer_id * 100 + group, child=child, prompt_token_ids=prompt,
                                  response_token_ids=response, rollout_log_probs=tuple(-3.0 for _ in response),
                                  token_versions=tuple(buffer_id for _ in response), version=buffer_id,
                                  reward=float(child == group % GROUP_SIZE), acc=0.0))  # fmt: skip
    return out


def generate(engine: Engine, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    params = SamplingParams(max_tokens=RESPONSE_LEN, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params)
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for result in engine.step().finished:
            outputs[result.request_id] = list(result.output_ids)
    torch.cuda.synchronize()
    return [outputs[str(i)] for i in range(len(prompts))], time.perf_counter() - started


def kv_block_bytes(model_dir: Path, block_size: int) -> int:
    spec = json.loads((model_dir / "config.json").read_text())
    head_dim = spec["hidden_size"] // spec["num_attention_heads"]
    return spec["num_hidden_layers"] * block_size * 2 * spec["num_key_value_heads"] * head_dim * 2  # bf16


def switch_bench(model_dir: Path, trainer_dtype: str, cycles: int, margin_gib: float) -> dict[str, float]:
    backend = TorchMemorySaverBackend(hook_mode(enable_cuda_graph=is_preloaded()))
    total = torch.cuda.mem_get_info()[1]
    base = used_bytes()
    overrides = [f"model.path={model_dir}", f"actor.dtype={trainer_dtype}", "topology.device=cuda",
                 f"psrl.staleness_buffer_entries={GROUPS}", f"psrl.rollout_n={GROUP_SIZE}",
                 f"actor.ppo_mini_batch_size={GROUPS}", "actor.ppo_micro_batch_size_per_gpu=8"]  # fmt: skip
    config = load_config("demo", overrides)
    trainer_memory = SideMemory(TRAINER, managed_regions("all", TRAINER), backend)
    core = TrainerCore(config, parallel=ParallelContext(device=torch.device("cuda")), memory=trainer_memory)
    vocab = core.policy.raw.config.vocab_size
    core.train_buffer(0, trajectories(0, vocab))
    torch.cuda.synchronize()
    trainer_bytes = used_bytes() - base
    first_pause = core.memory.pause()
    free_now = torch.cuda.mem_get_info()[0]
    block_size = 16
    num_blocks = int((free_now - margin_gib * GIB) // kv_block_bytes(model_dir, block_size))
    graphs = is_preloaded()
    rollout_memory = SideMemory(ROLLOUT, managed_regions("all", ROLLOUT, enable_cuda_graph=graphs), backend)
    args = EngineArgs(model_path=model_dir, dtype="bfloat16", device="cuda", num_kv_blocks=num_blocks,  # type: ignore[arg-type]
                      block_size=block_size, max_num_seqs=GROUPS * GROUP_SIZE, cuda_graphs=True)  # fmt: skip
    engine = Engine(args, memory=rollout_memory)
    prompts = [list(t.prompt_token_ids) for t in trajectories(99, vocab)[::GROUP_SIZE]] * GROUP_SIZE
    reference, _ = generate(engine, prompts)
    engine_bytes = used_bytes() - base - (trainer_bytes - first_pause.changed_bytes)
    print(f"trainer resident {trainer_bytes / GIB:.1f} GiB (after one step), engine resident {engine_bytes / GIB:.1f} "
          f"GiB ({num_blocks} KV blocks, decode {engine.runner.decode_path}); together they need "
          f"{(base + trainer_bytes + engine_bytes) / GIB:.1f} GiB of {total / GIB:.1f} GiB")  # fmt: skip
    reports: list[SwitchReport] = [first_pause]
    to_train, to_rollout, train_s, gen_s = [], [], [], []
    for cycle in range(1, cycles + 1):
        started = time.perf_counter()
        reports += [engine.release_memory(), core.memory.resume()]
        to_train.append((time.perf_counter() - started) * 1000)
        step_started = time.perf_counter()
        core.train_buffer(cycle, trajectories(cycle, vocab))
        torch.cuda.synchronize()
        train_s.append(time.perf_counter() - step_started)
        started = time.perf_counter()
        reports += [core.memory.pause(), engine.restore_memory()]
        to_rollout.append((time.perf_counter() - started) * 1000)
        tokens, seconds = generate(engine, prompts)
        gen_s.append(seconds)
        if tokens != reference:
            raise SystemExit(f"cycle {cycle}: greedy tokens after a resume differ from the first generation")
    print_reports(reports)
    freed = statistics.median(r.changed_bytes for r in reports if r.action == "pause" and r.side == ROLLOUT)
    freed += statistics.median(r.changed_bytes for r in reports if r.action == "pause" and r.side == TRAINER)
    print(f"full switch to the trainer: {fmt_ms(to_train)}; back to rollout: {fmt_ms(to_rollout)}; train step "
          f"{statistics.median(train_s):.2f} s; generation {statistics.median(gen_s):.2f} s (greedy tokens equal "
          f"in every cycle)")  # fmt: skip
    return {
        "switch_ms": max(statistics.median(to_train), statistics.median(to_rollout)),
        "to_train_ms": statistics.median(to_train),
        "to_rollout_ms": statistics.median(to_rollout),
        "freed_gib": freed / GIB,
        "needs_gib": (base + trainer_bytes + engine_bytes) / GIB,
        "device_gib": total / GIB,
    }


def fmt_ms(values: list[float]) -> str:
    return f"median {statistics.median(values):.0f} ms (" + ", ".join(f"{v:.0f}" for v in values) + ")"


def print_reports(reports: list[SwitchReport]) -> None:
    print(f"\n{'side':<9}{'action':<8}{'median ms':>10}{'GiB':>8}   per region (median ms)")
    for side in (TRAINER, ROLLOUT):
        for action in ("pause", "resume"):
            rows = [r for r in reports if r.side == side and r.action == action and r.duration_ms > 0]
            if not rows:
                continue
            regions = {name: statistics.median(r.region_ms[name] for r in rows) for name in rows[0].region_ms}
            per_region = " ".join(f"{k}={v:.1f}" for k, v in regions.items())
            ms = statistics.median(r.duration_ms for r in rows)
            gib = statistics.median(r.changed_bytes for r in rows) / GIB
            print(f"{side:<9}{action:<8}{ms:>10.1f}{gib:>8.2f}   {per_region}")


def e2e_bench(model_dir: Path, steps: int) -> float:
    workload = [f"model.path={model_dir}", "topology.device=cuda", "topology.n_rollout_instances=1",
                f"trainer.total_steps={steps}", "psrl.staleness_buffer_entries=8", "psrl.rollout_n=4",
                "actor.ppo_mini_batch_size=8", "psrl.staleness=1", "task.max_response_length=128",
                "engine.num_kv_blocks=4096"]  # fmt: skip
    layouts = {"shared": [], "colocated": ["topology.colocate=True", "psrl.tms.range=all"]}
    rates = {}
    for name, extra in layouts.items():
        run = InProcessRun(load_config("demo", [*workload, *extra]))
        started = time.perf_counter()
        record = run.run()
        seconds = time.perf_counter() - started
        if record.finished is None or not record.finished.success:
            raise SystemExit(f"{name}: the run did not finish")
        num = sum(p.num_samples for p in record.progress)
        rates[name] = num / seconds
        switches = [v for m in record.metrics for k, v in m.values.items() if k.startswith("tms/switch_to_")]
        extra_note = f", {len(switches)} switches" if switches else ""
        print(
            f"e2e {name}: {steps} steps, {num} trajectories in {seconds:.1f} s = {rates[name]:.2f} traj/s{extra_note}"
        )
        del run
        torch.cuda.empty_cache()
    return rates["colocated"] / rates["shared"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--e2e-shape", default="qwen2.5-0.5b")
    parser.add_argument("--trainer-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--margin-gib", type=float, default=6.0, help="device memory left free beside the KV cache")
    parser.add_argument("--e2e-steps", type=int, default=4)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--e2e-only", action="store_true", help=argparse.SUPPRESS)  # the e2e part's own process
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_tms needs a CUDA device")
    torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")  # cuBLAS workspace outside any region
    with tempfile.TemporaryDirectory() as tmp:
        if args.e2e_only:
            e2e_dir = Path(tmp) / args.e2e_shape
            write_model(args.e2e_shape, e2e_dir)
            print(f"RESULT colocated_vs_shared={e2e_bench(e2e_dir, args.e2e_steps):.3f}")
            return
        # first, in its own process: this one's switch part then fills the device
        e2e = {} if args.skip_e2e else {"colocated_vs_shared": run_e2e_process(args)}
        model_dir = Path(tmp) / args.shape
        print(f"{args.shape}: {write_model(args.shape, model_dir) / 1e9:.2f} B parameters (demo vocabulary), "
              f"trainer {args.trainer_dtype}, hook mode {hook_mode(enable_cuda_graph=is_preloaded())}")  # fmt: skip
        result = {**switch_bench(model_dir, args.trainer_dtype, args.cycles, args.margin_gib), **e2e}
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in result.items()))


def run_e2e_process(args: argparse.Namespace) -> float:
    command = [
        sys.executable,
        __file__,
        "--e2e-only",
        "--e2e-shape",
        args.e2e_shape,
        "--e2e-steps",
        str(args.e2e_steps),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = completed.stdout.splitlines()
    print("\n".join(line for line in lines if line.startswith("e2e ")))
    results = [line for line in lines if line.startswith("RESULT ")]
    if completed.returncode != 0 or not results:
        print(completed.stdout[-3000:], completed.stderr[-3000:], sep="\n")
        raise SystemExit(f"the e2e part failed (exit code {completed.returncode})")
    return float(results[-1].split("=")[1])


if __name__ == "__main__":
    main()
