"""End-to-end throughput: synchronous training versus psrl async, on the same long-tail workload.

Runs the same topology twice, back to back, in one invocation:

  sync   staleness 0, partial and redundant rollout off (the synchronous baseline)
  async  staleness 2, partial rollout, the seeds' reasoning profile (request_num_balance,
         preempted requests back to the router at once, migration 5x / stop 10)

Responses follow a log-normal length distribution (`task.response_lengths=long_tail`) like
reasoning traces, so a synchronous step waits for its longest response. Prints trajectories/s
and tokens/s consumed by the trainer, rollout busy and trainer idle fractions, weight-sync
times, and a last line ``RESULT speedup_vs_sync=... rollout_busy=... trainer_idle=...``.

    python tools/bench_e2e.py --quick            # about 3 minutes on 2 CPU cores
    python tools/bench_e2e.py --steps 30 topology.device=cuda
    python tools/bench_e2e.py --scale gpu model.path=/tmp/qwen05-body   # one H200

``--scale gpu`` is the real-scale workload: 64 prompts x 8 responses per step, log-normal
response lengths (median 512, capped at 4096), 256 concurrent sequences per engine, trainer and
rollout on one GPU, weights through shared memory. It also measures the serial limit on the
same GPU: the engine alone kept full (the same model, concurrency and length distribution, no
actors) and the trainer alone on buffers of the same shape, one after the other; the system's
consumed tokens/s over that limit is ``system_vs_serial_limit``. Last, in a child process, the
weight sync of a 1.5B and a 7B model against the machine's copy limits
(``tools/bench_weight_sync.py``), then ``RESULT speedup_vs_sync=...
system_vs_serial_limit=... sync_s_7b=... sync_vs_floor_7b=...
delta_bytes_ratio=...``.

``--layout colocated`` (one CUDA device) runs the async settings twice instead: ``shared`` (trainer and
rollout resident on the same GPU at once) and ``colocated`` (they take turns, ``psrl.tms.range=all``),
checks the colocated run's recorded decisions with ``psrl replay --check all``, and ends with
``RESULT colocated_vs_shared=... replay_agreement=... switches=...``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launch.supervisor import EXIT_OK, Supervisor
from psrl.config import load_config
from psrl.log import configure
from psrl.preflight import checked
from psrl.report.collect import read_timeline
from psrl.report.series import metric_by_step
from psrl.report.summary import RunSummary, summarize
from psrl.report.timeline import LoadedPoint, RunTimeline
from psrl.rundir import RunDir

RC = "psrl.rollout_coordination."
PROMPT_TOKENS = 64  # the engine-alone and trainer-alone prompts
WORKLOAD = [
    "psrl.staleness_buffer_entries=8",
    "psrl.rollout_n=4",
    "actor.ppo_mini_batch_size=8",
    "task.response_lengths=long_tail",
    "task.long_tail_median=48",
    "task.long_tail_sigma=1.2",
    "task.max_response_length=480",
    "engine.max_num_seqs=32",
]
GPU_WORKLOAD = [
    "topology.device=cuda",
    "topology.n_rollout_instances=1",
    "psrl.staleness_buffer_entries=64",
    "psrl.rollout_n=8",
    "actor.ppo_mini_batch_size=64",
    "task.response_lengths=long_tail",
    "task.long_tail_median=512",
    "task.long_tail_sigma=0.8",
    "task.max_response_length=4096",
    "engine.max_num_seqs=256",
    "engine.num_kv_blocks=16384",
    # 4k-token responses: micro-batches bounded in tokens; recomputation is decided by the memory
    # budget (actor.gradient_checkpointing=auto)
    "actor.use_dynamic_bsz=True",
    "actor.ppo_max_token_len_per_gpu=16384",
    "actor.compute_dtype=bfloat16",  # fp32 arithmetic made the step 100 s of a 160 s sync step on an H200
    "psrl.ps.transport=shm",
    "psrl.ps.serve_dtype=engine",
]
PHASES = {
    "sync": ["psrl.staleness=0", f"{RC}partial_rollout.enable=False", f"{RC}redundant_rollout.enable=False"],
    "async": [
        "psrl.staleness=2",
        f"{RC}partial_rollout.enable=True",
        f"{RC}routing_strategy.method=request_num_balance",
        f"{RC}routing_strategy.max_num_waiting_reqs_after_preemption=0",
        f"{RC}sync_and_mig_strategy.mig.enable=True",
        f"{RC}sync_and_mig_strategy.mig.threshold=5",
        f"{RC}sync_and_mig_strategy.mig.stop_threshold=10",
    ],
}


def engine_full_batch_tok_s(overrides: list[str], in_flight: int, total: int) -> float:
    """Response tokens/s of the engine alone, kept full: `in_flight` requests at a time on the run's
    model and response lengths, each finished one replaced at once until `total` were started. The
    rate counts the window in which the engine was full (up to the last start), so no tail of a
    draining batch lowers it: the rate the system could reach if rollout never waited."""
    from psrl.coordination.lengths import forced_length
    from psrl.engine import SamplingParams
    from psrl.engine.protocol import build_engine

    config = checked(load_config("demo", overrides))
    engine = build_engine(config)
    vocab_size = engine.spec.vocab_size
    prompt = [3 + i % (vocab_size - 3) for i in range(PROMPT_TOKENS)]

    def start(request: int) -> None:
        length = forced_length(config.task, request) or config.task.max_response_length
        params = SamplingParams(max_tokens=length, min_tokens=length, ignore_eos=True, temperature=1.0)
        engine.add_request(str(request), prompt, params)

    for request in range(in_flight):
        start(request)
    started_count, num_tokens = in_flight, 0
    began = time.monotonic()
    while started_count < total:
        for result in engine.step().finished:
            num_tokens += len(result.output_ids)
            if started_count < total:
                start(started_count)
                started_count += 1
    elapsed = time.monotonic() - began
    return num_tokens / elapsed


def trainer_alone_tok_s(model_path: str, steps: int = 2) -> float:
    """Response tokens/s of the trainer alone on buffers of the run's shape (64 prompts x 8, the same
    log-normal lengths), from ``tools/bench_trainer.py`` in a child process (its default
    configuration: the trainer's own, as in the run)."""
    tool = Path(__file__).with_name("bench_trainer.py")
    lengths = ["--prompt-len", str(PROMPT_TOKENS), "--median", "512", "--sigma", "0.8", "--max-len", "4096"]
    command = [
        sys.executable,
        str(tool),
        "--model",
        model_path,
        "--variants",
        "default",
        "--steps",
        str(steps),
        *lengths,
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    if completed.returncode or not lines:
        print(completed.stdout, completed.stderr[-3000:], sep="")
        raise SystemExit(f"the trainer-alone measurement failed (exit code {completed.returncode})")
    pairs = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    return float(pairs["default_response_tok_s"])


def serial_limit_figures(common: list[str], system_tok_s: float) -> str:
    """The serial limit on one shared GPU: generating a token with the engine full, then training on
    it with the trainer alone, one after the other (1 / (1/engine + 1/trainer)); an async system
    that overlaps the two perfectly on one device can do no better than keep both at these rates."""
    config = load_config("demo", common)
    engine = engine_full_batch_tok_s(common, in_flight=config.engine.max_num_seqs, total=4 * config.engine.max_num_seqs)
    trainer = trainer_alone_tok_s(str(config.model.path))
    serial = 1.0 / (1.0 / engine + 1.0 / trainer)
    print(f"engine alone, kept full: {engine:.0f} response tok/s; trainer alone: {trainer:.0f} response tok/s; "
          f"serial limit {serial:.0f}; the async system consumed {system_tok_s:.0f} tok/s")  # fmt: skip
    return (
        f" system_vs_serial_limit={system_tok_s / serial:.3f} serial_limit_tok_s={serial:.0f}"
        f" engine_full_tok_s={engine:.0f} trainer_alone_tok_s={trainer:.0f}"
    )


LAYOUTS = {
    "shared": ["topology.device=cuda", *PHASES["async"]],
    "colocated": ["topology.device=cuda", "topology.colocate=True", "psrl.tms.range=all", *PHASES["async"]],
}


def run_phase(name: str, overrides: list[str], root: Path) -> RunSummary:
    config = load_config("demo", overrides)
    config = checked(config)
    run_dir = RunDir.create(root, name)
    started = time.monotonic()
    code = Supervisor(config, run_dir).run()
    if code != EXIT_OK:
        raise SystemExit(f"{name} run failed with exit code {code}; see {run_dir.path / 'logs'}")
    timeline = read_timeline(run_dir.path)
    summary = summarize(timeline)
    print(f"  {name}: {summary.num_steps} steps in {time.monotonic() - started:.0f} s (run directory {run_dir.path})")
    print_breakdown(timeline)
    return summary


BREAKDOWN = [
    ("train", "perf/train_seconds"),
    ("logprob fwd", "perf/forward_s"),
    ("fwd+bwd+opt", "perf/update_s"),
    ("push", "sync/push_s"),
]


def print_breakdown(timeline: RunTimeline) -> None:
    """Per training step: its wall time, the trainer's phases, weight loads, and what is left (waiting)."""
    series = {label: dict(metric_by_step(timeline.metrics, name)) for label, name in BREAKDOWN}
    loads: dict[int, list[LoadedPoint]] = {}
    for point in timeline.loaded:
        loads.setdefault(point.version, []).append(point)
    header = "".join(f"{label:>12}" for label, _ in BREAKDOWN)
    print(f"    step  wall s  {header}   pull ms   load ms  trainer wait s")
    previous = timeline.first_dispatch or timeline.start
    for point in sorted(timeline.progress, key=lambda p: p.time):
        if point.num_samples == 0:
            continue
        wall = point.time - previous
        previous = point.time
        values = [series[label].get(point.step) for label, _ in BREAKDOWN]
        busy = sum(v for v in (values[0], values[3]) if v is not None)
        loaded = loads.get(point.version, [])
        pull = max((p.pull_ms for p in loaded), default=float("nan"))
        load = max((p.load_ms for p in loaded), default=float("nan"))
        cells = "".join(f"{_value(v):>12.2f}" for v in values)
        print(f"    {point.step:>4}  {wall:>6.1f}  {cells}  {pull:>8.0f}  {load:>8.0f}  {max(wall - busy, 0.0):>14.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few steps (CI-class machines)")
    parser.add_argument("--scale", choices=["cpu", "gpu"], default="cpu", help="gpu: the real-scale workload")
    parser.add_argument("--steps", type=int, default=None, help="training steps per phase")
    parser.add_argument("--root", type=Path, default=None, help="where the two run directories go")
    parser.add_argument("--layout", choices=["sync-vs-async", "colocated"], default="sync-vs-async")
    parser.add_argument("--phases", default="sync,async", help="which phases to run (one alone prints no RESULT)")
    parser.add_argument("--weight-sync", default=None, metavar="SHAPES",
                        help="--scale gpu: also measure weight sync of these shapes (tools/bench_weight_sync.py; "
                        "default qwen2.5-1.5b,qwen2.5-7b; '' skips it)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="config overrides applied to both phases")
    args = parser.parse_args()
    configure("warning")
    steps = args.steps or (8 if args.quick else 24)
    root = args.root or Path(tempfile.mkdtemp(prefix="psrl-bench-e2e-"))
    workload = GPU_WORKLOAD if args.scale == "gpu" else WORKLOAD
    common = [*workload, f"trainer.total_steps={steps}", *args.overrides]
    if args.layout == "colocated":
        colocated_layout(common, root)
        return
    phases = args.phases.split(",")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"--phases: unknown {unknown}; choose from {sorted(PHASES)}")
    results = {name: run_phase(name, [*common, *PHASES[name]], root) for name in phases}
    print_table(results)
    if set(results) != set(PHASES):  # one phase only (profiling, a step breakdown): no comparison
        return
    sync, fast = results["sync"], results["async"]
    speedup = _ratio(fast.trajectories_per_s, sync.trajectories_per_s)
    extra = ""
    if args.scale == "gpu":
        extra = serial_limit_figures(common, _value(fast.tokens_per_s))
        shapes = "qwen2.5-1.5b,qwen2.5-7b" if args.weight_sync is None else args.weight_sync
        extra += "".join(f" {k}={v}" for k, v in weight_sync_figures(shapes).items())
    print(f"RESULT speedup_vs_sync={speedup:.3f} rollout_busy={_value(fast.busy_fraction):.3f} "
          f"trainer_idle={_value(fast.trainer_idle_fraction):.3f} sync_rollout_busy={_value(sync.busy_fraction):.3f} "
          f"sync_trainer_idle={_value(sync.trainer_idle_fraction):.3f}{extra}")  # fmt: skip


def weight_sync_figures(shapes: str) -> dict[str, str]:
    """Push+pull+load of whole models of these shapes and the delta-sync bytes ratio, from
    ``tools/bench_weight_sync.py`` in a child process (it needs the GPU to itself for its limits)."""
    if not shapes:
        return {}
    tool = Path(__file__).with_name("bench_weight_sync.py")
    command = [sys.executable, str(tool), "--shapes", shapes, "--rounds", "2", "--probe-gb", "1"]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    print(completed.stdout, completed.stderr[-2000:] if completed.returncode else "", sep="")
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    if completed.returncode or not lines:
        return {"weight_sync_failed": str(completed.returncode or "no-result")}
    pairs = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    wanted = ("sync_s_", "sync_vs_floor_", "delta_bytes_ratio", "delta_exact")
    return {k: v for k, v in pairs.items() if k.startswith(wanted)}


def colocated_layout(common: list[str], root: Path) -> None:
    from psrl.replay import replay_run

    results = {name: run_phase(name, [*common, *extra], root) for name, extra in LAYOUTS.items()}
    print_table(results)
    report = replay_run(root / "colocated", ("all",), ())
    decisions = sum(c.agreement.num_decisions - c.agreement.num_skipped for c in report.checkers)
    agreeing = sum(c.agreement.num_agree for c in report.checkers)
    switches = read_timeline(root / "colocated").switches
    ratio = _ratio(results["colocated"].trajectories_per_s, results["shared"].trajectories_per_s)
    print(f"RESULT colocated_vs_shared={ratio:.3f} replay_agreement={agreeing / max(decisions, 1):.4f} "
          f"replay_decisions={decisions} switches={len(switches)}")  # fmt: skip


def _value(value: float | None) -> float:
    return float("nan") if value is None else value


def _ratio(a: float | None, b: float | None) -> float:
    return _value(a) / _value(b) if b else float("nan")


def print_table(results: dict[str, RunSummary]) -> None:
    rows = [
        ("trajectories/s", "trajectories_per_s", "{:.2f}"),
        ("tokens/s", "tokens_per_s", "{:.0f}"),
        ("rollout busy", "busy_fraction", "{:.2f}"),
        ("trainer idle", "trainer_idle_fraction", "{:.2f}"),
        ("push ms", "push_ms_mean", "{:.1f}"),
        ("pull+load ms", "load_ms_mean", "{:.1f}"),
        ("  of which pull", "pull_ms_mean", "{:.1f}"),
        ("work window s", "work_s", "{:.1f}"),
    ]
    names = list(results)
    print(f"\n{'':<16}" + "".join(f"{n:>12}" for n in names) + f"{'ratio':>10}")
    for label, attr, fmt in rows:
        values = [_value(getattr(results[n], attr)) for n in names]
        ratio = f"{_ratio(values[1], values[0]):>10.2f}" if len(values) == 2 else ""
        print(f"{label:<16}" + "".join(f"{fmt.format(v):>12}" for v in values) + ratio)
    for name in names:
        busy = " ".join(f"{k}={v:.2f}" for k, v in results[name].busy_by_instance.items())
        print(f"  {name} busy by instance: {busy}")


if __name__ == "__main__":
    main()
