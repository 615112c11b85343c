#!/usr/bin/env python3
"""The agentic profile against plain balancing, on an agent workload, in one invocation.

Sessions of many turns (psrl.sim.agent_workload: a long first prompt, then per turn generated tokens
and a tool's output after a heavy-tailed delay, so every context grows turn by turn) run on the real
router, session scheduler and engines, rollout side only (tools/agentic_rollout.py: no trainer,
wall clock), for ``--budget-s`` seconds under each setting, on the same engines:

  a  balance   request_num_balance, no stickiness
  b  sticky    cache_aware_v1 with trajectory stickiness
  c  thunder   (b) plus ThunderAgent hang/continue (bucketed)
  d  tier      (c) plus the KV offload tier (psrl.lmcache: evicted prefix blocks in host memory),
               its bytes in LMCache's CPU backend where the lmcache package is installed, else in
               psrl's own host buffer (psrl.lmcache.store=host; --tier-store chooses)

Printed per setting: turns/s and sessions/s, time to first token per turn (p50 / p99, from the
turn's tool output or first prompt to its first streamed token, so hung time counts), prefix-cache
hits as a share of perfect sticky reuse (every continuing turn reusing its whole previous context),
re-prefilled tokens per turn (prefilled tokens that had been computed before), KV-full preemptions,
hung session-seconds and the longest wait of a ready turn. Before the runs a probe measures what a
prefill of a typical context costs (per token, and in decode steps) on these engines; with (a)'s
re-prefilled tokens per turn and turns/s that gives the share of (a)'s wall time spent re-prefilling,
and so the most any reuse could speed (a) up. On the tiny CPU model that share is small (a prefill is
cheap next to the rest of a turn), so the output says the profile cannot win there.

    python tools/bench_agentic.py                    # tiny CPU model: the profile cannot win (said why)
    python tools/bench_agentic.py --scale cpu-long   # CPU, contexts long enough that it does
    python tools/bench_agentic.py --scale gpu        # one H200, Qwen2.5-1.5B body (about 6 minutes)
    python tools/bench_agentic.py --scale gpu --dry-run-cpu   # the gpu path on CPU with a tiny model

``--log-dir DIR`` writes each setting's event log and config (DIR/<setting>) and checks it with the
replay checkers (``psrl replay --check all DIR/<setting>`` does the same); ``--json PATH`` writes the
workload, the probe, every figure, every engine step of each setting (``psrl.sim.step_trace``), the
profiled cost model and the tier's room and copy cost: what the simulator needs to be run again offline.

The last line is ``RESULT agentic_speedup_vs_balance=<(c)/(a) turns/s> reuse_of_perfect=<(c)>
tier_speedup=<(d)/(c)> sticky_speedup_vs_balance=<(b)/(a)>
ttft_p99_ratio=<(c)/(a)>``, with ``sim_max_error=<largest |predicted / measured - 1| of (a)-(c)>`` under
``--predict`` (the same workload on the simulator's modelled engines, psrl.sim.agentic, with the cost
model of the engine profiled after the windows) and ``sim_max_error_run`` (the same with the cost model
fitted on the run's own engine steps, psrl.sim.step_trace: the simulator calibrated on the run).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.assets import DEMO_MODEL_DIR
from psrl.config import Config, load_config
from psrl.engine import Engine, EngineArgs, SamplingParams
from psrl.engine.decode_rounds import round_buckets
from psrl.engine_cost.fit import fit_cost_model
from psrl.engine_cost.model import CostModel, CostModelError
from psrl.sim.agent_workload import AgentWorkload
from psrl.sim.agentic import AgentSimulation
from psrl.sim.profiling import ProfileGrid, profile_engine
from psrl.sim.step_trace import StepRecord, trace_samples
from tools.agentic_rollout import AgentOutcome, AgentRollout

RC = "psrl.rollout_coordination."
GOAL = 1.5  # the profile's goal against request_num_balance, in turns/s
SETTINGS: dict[str, list[str]] = {
    "balance": [
        RC + "routing_strategy.method=request_num_balance",
        RC + "routing_strategy.enable_trajectory_sticky=false",
        RC + "session_strategy.thunder_agent.enable=false",
    ],
    "sticky": [RC + "session_strategy.thunder_agent.enable=false"],
    "thunder": [RC + "session_strategy.thunder_agent.enable=true"],
    "tier": [RC + "session_strategy.thunder_agent.enable=true", "psrl.lmcache.enable=true"],
}


@dataclass(frozen=True)
class Scale:
    workload: AgentWorkload
    instances: int
    kv_blocks: int  # per instance
    max_num_seqs: int
    batched_tokens: int
    budget_s: float  # per setting
    tier_gb: float  # the (d) tier's host memory, all instances together
    max_positions: int  # the model's context (a copy of the demo model with this many positions on CPU)
    shape: str | None = None  # a tools/random_model.py body (gpu); None = the demo body


SCALES = {
    # the tiny demo model, short contexts: a prefill costs about one decode step (the profile cannot win)
    "cpu": Scale(
        AgentWorkload(
            sessions=16,
            prompt_tokens=(24, 64),
            turns=(3, 6),
            gen_tokens=(6, 16),
            tool_tokens=(8, 24),
            tool_median_s=0.05,
            tool_sigma=1.0,
            max_context=480,
            vocab=(2, 48),
            ramp_s=1.0,
        ),
        instances=2,
        kv_blocks=96,
        max_num_seqs=16,
        batched_tokens=2048,
        budget_s=20,
        tier_gb=0.05,
        max_positions=512,
    ),
    # the same body with contexts of thousands of tokens: a re-prefill costs many decode steps
    "cpu-long": Scale(
        AgentWorkload(
            sessions=8,
            prompt_tokens=(512, 1024),
            turns=(4, 10),
            gen_tokens=(8, 24),
            tool_tokens=(32, 128),
            tool_median_s=0.2,
            tool_sigma=1.0,
            max_context=2048,
            vocab=(2, 48),
            ramp_s=1.0,
        ),
        instances=2,
        kv_blocks=512,
        max_num_seqs=8,
        batched_tokens=2048,
        budget_s=40,
        tier_gb=0.2,
        max_positions=2048,
    ),
    # one H200: Qwen2.5-1.5B body, 128 sessions of 2k-8k first prompts growing to 32k over 8-30 turns,
    # two instances whose KV (480k tokens each) binds once contexts average 7.5k (a few turns in)
    "gpu": Scale(
        AgentWorkload(
            sessions=128,
            prompt_tokens=(2000, 8000),
            turns=(8, 30),
            gen_tokens=(50, 500),
            tool_tokens=(200, 2000),
            tool_median_s=1.0,
            tool_sigma=1.0,
            max_context=32768,
            vocab=(2, 48),
            ramp_s=10.0,
        ),
        instances=2,
        kv_blocks=30000,
        max_num_seqs=128,
        batched_tokens=8192,
        budget_s=50,
        tier_gb=32,
        max_positions=32768,
        shape="qwen2.5-1.5b",
    ),
}
# --dry-run-cpu: the gpu path (its model writer, engines, settings, log and checks) shrunk to a tiny CPU run
DRY_RUN = Scale(
    AgentWorkload(sessions=8, prompt_tokens=(64, 256), turns=(2, 5), gen_tokens=(6, 16), tool_tokens=(16, 64),
                  tool_median_s=0.1, tool_sigma=1.0, max_context=1024, vocab=(2, 48), ramp_s=0.5),
    instances=2, kv_blocks=160, max_num_seqs=8, batched_tokens=1024, budget_s=8, tier_gb=0.02, max_positions=1024,
)  # fmt: skip


def write_model(scale: Scale, device: str, directory: Path) -> Path:
    """The model the engines load: a random Qwen2.5 body (gpu) or the demo model with more positions."""
    if (directory / "config.json").is_file():
        return directory
    if scale.shape is not None and device == "cuda":
        from tools.random_model import write_model as write_random

        print(f"writing a random {scale.shape} body to {directory} ...", flush=True)
        write_random(scale.shape, directory, max_positions=scale.max_positions)
        return directory
    shutil.copytree(DEMO_MODEL_DIR, directory, dirs_exist_ok=True)
    config = json.loads((directory / "config.json").read_text())
    config["max_position_embeddings"] = scale.max_positions  # RoPE: any length; only the cache grows
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def setting_config(scale: Scale, name: str, args: argparse.Namespace, model: Path) -> Config:
    w = scale.workload
    overrides = [
        f"model.path={model}",
        f"topology.device={args.device}",
        f"topology.n_rollout_instances={scale.instances}",
        f"engine.num_kv_blocks={scale.kv_blocks}",
        f"engine.max_num_seqs={scale.max_num_seqs}",
        f"engine.max_num_batched_tokens={scale.batched_tokens}",
        f"env.max_turns={w.turns[1]}",
        f"env.max_turn_tokens={w.gen_tokens[1]}",
        "psrl.rollout_n=1",  # one session per group (nothing trains: no group advantage needed)
        "algorithm.adv_estimator=reinforce_plus_plus",
        "psrl.staleness=0",
        "psrl.staleness_buffer_entries=4096",  # never the limit: each finished session's slot is freed
        "actor.ppo_mini_batch_size=4096",
        f"psrl.lmcache.offload_size_gb={scale.tier_gb}",
        *SETTINGS[name],
        *([f"psrl.lmcache.store={args.tier_store}"] if name == "tier" else []),
        *args.overrides,
    ]
    return load_config("agentic", overrides)


def build_engines(config: Config, *, round_path: bool = False) -> list[Engine]:
    """The instances' engines, each warmed up so that no setting's window pays for compiling or capturing.
    ``round_path``: decode rounds through the step kernels' torch reference (how a CPU run takes the GPU's
    decode path)."""
    args = EngineArgs.from_config(config)
    if round_path:
        args = replace(args, gpu_kernels="torch", decode_steps=4)
    engines = [Engine(args) for _ in range(config.topology.n_rollout_instances)]
    for engine in engines:
        warm(engine)
    return engines


def warm(engine: Engine) -> None:
    """A decode round at every batch bucket (each captures its CUDA graph once) and a long prefill."""
    steps = engine.args.decode_steps
    params = SamplingParams(max_tokens=2 * steps + 1, ignore_eos=True)
    for batch in round_buckets(engine.args.max_num_seqs):
        _drain(engine, {f"warm-{batch}-{i}": ([2 + (i + j) % 40 for j in range(16)], params) for i in range(batch)})
    long = min(engine.max_model_len - 1, 2 * engine.args.max_num_batched_tokens)
    _drain(engine, {"warm-long": ([3 + i % 41 for i in range(long)], SamplingParams(max_tokens=1, ignore_eos=True))})
    engine.reset_prefix_cache()


def free(engines: list[Engine]) -> None:
    engines.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class Probe:
    context: int
    prefill_s: float  # one sequence's prefill of ``context`` tokens
    decode_step_s: float  # one decode step of the whole batch
    batch: int

    @property
    def prefill_in_steps(self) -> float:
        return self.prefill_s / self.decode_step_s


def probe(engine: Engine, scale: Scale) -> Probe:
    """What a re-prefill costs on this engine, in decode steps (also warms kernels and graphs up)."""
    w = scale.workload
    context = min(w.max_context // 2, (w.prompt_tokens[0] + w.prompt_tokens[1]) // 2 + 3 * w.tool_tokens[1])
    batch = max(1, min(scale.max_num_seqs, w.sessions // scale.instances))
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    # the least of three (another process's burst of load inflates a single timing); each prompt its own
    prefill_s = min(
        _timed(engine, {f"p{k}": ([2 + (i * (k + 1)) % 40 for i in range(context)], one)}) for k in range(3)
    )
    steps = max(32, engine.args.decode_steps * 4)
    decode = SamplingParams(max_tokens=steps + 1, ignore_eos=True)
    requests = {f"d{i}": ([3 + (i + j) % 40 for j in range(32)], decode) for i in range(batch)}
    _drain(engine, {k: (v[0], SamplingParams(max_tokens=1, ignore_eos=True)) for k, v in requests.items()})
    for request_id, (tokens, params) in requests.items():  # prefills first, then time the decode steps
        engine.add_request(request_id, tokens, params)
    while any(outputs == 0 for _, outputs in engine.status().request_tokens.values()):
        engine.step()
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    decode_step_s = (time.perf_counter() - started) / steps
    engine.reset_prefix_cache()
    return Probe(context, prefill_s, decode_step_s, batch)


def _drain(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> None:
    for request_id, (tokens, params) in requests.items():
        engine.add_request(request_id, tokens, params)
    while engine.has_unfinished_requests():
        engine.step()


def _timed(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> float:
    _sync(engine)
    started = time.perf_counter()
    _drain(engine, requests)
    _sync(engine)
    return time.perf_counter() - started


def _sync(engine: Engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def run_settings(scale: Scale, args: argparse.Namespace, model: Path) -> tuple[dict[str, AgentOutcome], Probe, str]:
    """Every setting on the same engines (emptied between them; (d) on engines built with a tier), ``--repeats``
    times in alternating order (a b c d, d c b a, ...) so that a machine's changing load hits them alike."""
    configs = {name: setting_config(scale, name, args, model) for name in args.settings}
    plain = [n for n in args.settings if n != "tier"]
    engines = {"plain": build_engines(configs[plain[0]], round_path=args.dry_run_cpu) if plain else []}
    if "tier" in configs:
        engines["tier"] = build_engines(configs["tier"], round_path=args.dry_run_cpu)
    args.tier_tokens = tier_tokens(engines["tier"][0]) if "tier" in configs else 0
    args.tier_copy_s = tier_copy_cost(engines["tier"][0]) if "tier" in configs else 0.0
    first = next(e for e in engines.values() if e)[0]
    measured = probe(first, scale)
    print(f"engines built and warmed up in {time.perf_counter() - args.started:.0f} s", flush=True)
    outcomes: dict[str, AgentOutcome] = {}
    for repeat in range(args.repeats):
        for name in args.settings if repeat % 2 == 0 else reversed(args.settings):
            on = engines["tier" if name == "tier" else "plain"]
            outcome = run_one(name, configs[name], scale, on, args, repeat)
            outcomes[name] = outcomes[name].merged(outcome) if name in outcomes else outcome
    args.cost = calibrate(first) if args.predict else None  # after the windows: it cannot hold them up
    for built in engines.values():
        free(built)
    tier_note = ""
    if "tier" in configs:
        tier_note = (f"(d) tier: psrl.lmcache.store={args.tier_store} ({scale.tier_gb:g} GiB of host memory; "
                     f"a token's KV out to it and back in {args.tier_copy_s * 1e6:.2f} us)")  # fmt: skip
    return {name: outcomes[name] for name in args.settings}, measured, tier_note


def calibrate(engine: Engine) -> CostModel | None:
    """The engine's cost model, profiled on a quick grid of batch sizes and contexts (psrl calibrate's fit);
    None, said why, when that fails (the measured figures stand without it)."""
    started = time.perf_counter()
    try:
        results, prefill = profile_engine(engine, ProfileGrid.quick())
        fitted = fit_cost_model([r.sample for r in results] + prefill)
    except (RuntimeError, ValueError) as exc:  # a point that does not fit the engine, an unusable fit
        print(f"--predict: profiling the engine failed ({type(exc).__name__}: {exc}); no prediction", flush=True)
        return None
    engine.reset_prefix_cache()
    print(f"cost model in {time.perf_counter() - started:.0f} s: {fitted.summary()}", flush=True)
    return fitted.model


def tier_tokens(engine: Engine) -> int:
    """The room of an engine's offload tier, in tokens."""
    assert engine.offload is not None
    return engine.offload.tier_blocks * engine.args.block_size


def tier_copy_cost(engine: Engine, reps: int = 3) -> float:
    """Seconds per token to copy KV from the device to the tier's host memory and back (64 MiB of blocks,
    the best of ``reps``), measured before the runs on the tier's own buffer where it has one."""
    assert engine.offload is not None
    block = engine.offload.kv_cache[:, 0]
    count = max(1, (64 << 20) // (block.numel() * block.element_size()))
    slots = getattr(engine.offload.tier.store, "slots", None)
    rows = slots[:count] if slots is not None else torch.empty((count, *block.shape), dtype=block.dtype)
    on_device = torch.empty(rows.shape, dtype=rows.dtype, device=engine.device)
    best = math.inf
    for _ in range(reps):
        _sync(engine)
        started = time.perf_counter()
        on_device.copy_(rows, non_blocking=True)
        rows.copy_(on_device, non_blocking=True)
        _sync(engine)
        best = min(best, time.perf_counter() - started)
    return best / (len(rows) * engine.args.block_size)


def predict(
    scale: Scale, args: argparse.Namespace, model: Path, outcomes: dict[str, AgentOutcome]
) -> tuple[float, float | None]:
    """The simulator's turns/s for (a)-(d) next to the measured ones, on two cost models: the engine's profile
    (fitted on a grid after the windows) and the run's own engine steps (every setting's); the largest
    relative error of (a)-(c) of each (None where the steps fit no model)."""
    profiled = _predict_on("profile", args.cost, scale, args, model, outcomes)
    try:
        fitted = fit_cost_model(trace_samples(step for o in outcomes.values() for step in o.steps))
    except CostModelError as exc:
        print(f"--predict: the run's steps fit no cost model ({exc})")
        return profiled, None
    print(f"cost model of the run's engine steps ({fitted.num_samples} decode samples): {fitted.summary()}")
    return profiled, _predict_on("run", fitted.model, scale, args, model, outcomes)


def _predict_on(
    label: str, cost: CostModel, scale: Scale, args: argparse.Namespace, model: Path, outcomes: dict[str, AgentOutcome]
) -> float:
    worst = 0.0
    for name in (n for n in SETTINGS if n in outcomes):
        config = setting_config(scale, name, args, model)
        # this process steps every engine in turn on one device: while all have work, each waits for the others
        sharing = config.topology.n_rollout_instances
        tier = args.tier_tokens if name == "tier" else 0
        copy_s = args.tier_copy_s if name == "tier" else 0.0
        simulation = AgentSimulation(config, scale.workload, cost, engines_per_device=sharing, tier_tokens=tier,
                                     tier_copy_s_per_token=copy_s)  # fmt: skip
        predicted = simulation.run(scale.budget_s)
        measured = outcomes[name].turns_per_s
        error = predicted.turns_per_s / measured - 1
        if name != "tier":
            worst = max(worst, abs(error))
        reused = predicted.hit_tokens / max(predicted.hit_tokens + predicted.prefill_tokens, 1)
        print(f"sim ({label}) {name:8} {predicted.turns_per_s:8.2f} turns/s predicted, {measured:.2f} measured "
              f"({error:+.0%}); reused {reused:.2f} "
              f"of its context tokens, {predicted.preemptions} preemptions, {predicted.hung_s:.0f} hung s, "
              f"{predicted.held_turns} held turns (p99 wait {predicted.held_p99_s:.2f} s); TTFT p50/p99 "
              f"{predicted.ttft(0.5):.2f}/{predicted.ttft(0.99):.2f} s predicted, "
              f"{outcomes[name].ttft(0.5):.2f}/{outcomes[name].ttft(0.99):.2f} s measured")  # fmt: skip
    return worst


def run_one(
    name: str, config: Config, scale: Scale, engines: list[Engine], args: argparse.Namespace, repeat: int
) -> AgentOutcome:
    log_dir = None if args.log_dir is None or repeat else args.log_dir / name  # the first run of each is logged
    started = time.perf_counter()
    record_steps = args.predict or args.json is not None  # for the run-calibrated simulator
    outcome = AgentRollout(config, scale.workload, engines, log_dir=log_dir, record_steps=record_steps).run(
        scale.budget_s
    )
    print(f"  {name}: {outcome.turns} turns, {outcome.sessions} sessions in {time.perf_counter() - started:.0f} s",
          flush=True)  # fmt: skip
    return outcome


def tier_store(choice: str) -> str:
    """The (d) tier's store: LMCache's CPU backend where the lmcache package is installed, else psrl's own
    host buffer (``auto``); or as chosen."""
    if choice == "auto":
        return "lmcache" if importlib.util.find_spec("lmcache") is not None else "host"
    return choice


def report(
    outcomes: dict[str, AgentOutcome],
    measured: Probe,
    tier_note: str,
    scale_name: str,
    sim_errors: tuple[float, float | None] | None,
) -> None:
    print(f"probe: a {measured.context}-token context prefills in {measured.prefill_s * 1000:.1f} ms = "
          f"{measured.prefill_in_steps:.1f} decode steps of a batch of {measured.batch} "
          f"({measured.decode_step_s * 1000:.2f} ms)")  # fmt: skip
    base = outcomes.get("balance")
    if base is not None:
        per_token = measured.prefill_s / measured.context
        share = base.reprefill_per_turn * per_token * base.turns_per_s  # of the wall time
        busy = base.engine_busy_s / base.wall_s
        saved = min(0.99, share / max(busy, 1e-9))  # of the engines' time
        verdict = (
            f"the profile cannot win much on this {scale_name} scale: a re-prefill is cheap (a context prefills "
            f"in {measured.prefill_in_steps:.0f} decode steps' time) next to the rest of a turn's work"
            if 1 / (1 - saved) < GOAL
            else "contexts are long enough here for reuse to pay"
        )
        print(f"note: in (a) the engines were busy {busy:.0%} of the wall time and re-prefilled {share:.0%} of it "
              f"({base.reprefill_per_turn:.0f} tokens per turn at {per_token * 1e6:.0f} us each): perfect reuse "
              f"saves at most {saved:.0%} of the engines' time, {1 / (1 - saved):.2f}x where they are the "
              f"bottleneck; {verdict}")  # fmt: skip
    print(
        f"{'setting':8} {'turns/s':>8} {'sess/s':>7} {'ttft p50':>8} {'ttft p99':>8} {'of perfect':>10} "
        f"{'reprefill/turn':>14} {'preempt':>7} {'hung s':>7} {'hangs':>5} {'max wait':>8} {'ctx ends':>8}"
    )
    for name, o in outcomes.items():
        print(f"{name:8} {o.turns_per_s:8.2f} {o.sessions_per_s:7.3f} {o.ttft(0.5):8.3f} {o.ttft(0.99):8.3f} "
              f"{o.reuse_of_perfect:10.3f} {o.reprefill_per_turn:14.1f} {o.preemptions:7d} {o.hung_s:7.1f} "
              f"{o.hangs:5d} {o.max_hold_s:8.2f} {o.context_ends:8d}")  # fmt: skip
    if tier_note:
        print(tier_note)
    nan = float("nan")
    a, b, c, d = (outcomes.get(n) for n in ("balance", "sticky", "thunder", "tier"))

    def ratio(x: float | None, y: float | None) -> float:
        return x / y if x is not None and y else nan

    print(
        f"RESULT agentic_speedup_vs_balance={ratio(c and c.turns_per_s, a and a.turns_per_s):.3f} "
        f"reuse_of_perfect={c.reuse_of_perfect if c else nan:.3f} "
        f"tier_speedup={ratio(d and d.turns_per_s, c and c.turns_per_s):.3f} "
        f"sticky_speedup_vs_balance={ratio(b and b.turns_per_s, a and a.turns_per_s):.3f} "
        f"ttft_p99_ratio={ratio(c and c.ttft(0.99), a and a.ttft(0.99)):.3f}"
        + ("" if sim_errors is None else f" sim_max_error={sim_errors[0]:.3f}")
        + ("" if sim_errors is None or sim_errors[1] is None else f" sim_max_error_run={sim_errors[1]:.3f}")
    )


def check_replay(log_dir: Path, names: list[str]) -> bool:
    """``psrl replay --check all`` on each setting's log; True when every judged decision agrees."""
    from psrl.replay import replay_run

    agree = True
    for name in names:
        report_ = replay_run(log_dir / name, ["all"])
        judged = sum(c.agreement.num_decisions - c.agreement.num_skipped for c in report_.checkers)
        disagree = sum(c.agreement.num_disagree for c in report_.checkers)
        parts = ", ".join(f"{c.name} {c.agreement.num_agree}/{c.agreement.num_decisions}" for c in report_.checkers)
        print(f"replay {name}: {judged - disagree}/{judged} judged decisions agree ({parts})")
        agree &= disagree == 0
    return agree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    parser.add_argument("--dry-run-cpu", action="store_true", help="the chosen scale's code path, tiny, on CPU")
    parser.add_argument("--model", type=Path, help="model directory (default: written to --model-dir)")
    parser.add_argument("--model-dir", type=Path, help="where the model is written (kept; reused when present)")
    parser.add_argument("--budget-s", type=float, help="seconds per setting (default: the scale's)")
    parser.add_argument("--sessions", type=int, help="concurrent sessions (default: the scale's)")
    parser.add_argument("--instances", type=int, help="rollout instances (default: the scale's)")
    parser.add_argument("--kv-blocks", type=int, help="KV blocks per instance (default: the scale's)")
    parser.add_argument("--turns", type=str, help="turns per session, LO-HI (default: the scale's)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads on CPU (1: a busy machine's cores are not fought over)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="run the settings this often, alternating order")
    parser.add_argument("--settings", default="balance,sticky,thunder,tier", help="comma-separated subset")
    parser.add_argument("--tier-store", choices=["auto", "lmcache", "host"], default="auto",
                        help="(d)'s store: auto = lmcache where installed, else psrl's host buffer")  # fmt: skip
    parser.add_argument("--predict", action="store_true",
                        help="also profile the engine and predict (a)-(c) in the simulator")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the workload, probe and figures to this file")
    parser.add_argument("--log-dir", type=Path, help="write each setting's event log under it and replay-check it")
    parser.add_argument("overrides", nargs="*", help="config overrides key=value for every setting")
    args = parser.parse_args()
    scale = DRY_RUN if args.dry_run_cpu else SCALES[args.scale]
    scale = _with_knobs(scale, args)
    args.device = "cuda" if args.scale == "gpu" and not args.dry_run_cpu else "cpu"
    args.settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    args.tier_store = tier_store(args.tier_store)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"--settings: unknown {unknown}; choose from {', '.join(SETTINGS)}")
    with tempfile.TemporaryDirectory(prefix="bench-agentic-") as scratch:
        model = args.model or write_model(scale, args.device, args.model_dir or Path(scratch) / "model")
        started = args.started = time.perf_counter()
        outcomes, measured, tier_note = run_settings(scale, args, model)
    print(
        f"{len(outcomes)} settings in {time.perf_counter() - started:.0f} s ({scale.budget_s:.0f} s each, "
        f"{scale.workload.sessions} sessions, {scale.instances} instances x "
        f"{setting_config(scale, args.settings[0], args, model).engine.num_kv_blocks} KV blocks)"
    )
    if args.log_dir is not None and not check_replay(args.log_dir, list(outcomes)):
        print("replay: some recorded decisions disagree (see above)")
    if args.json is not None:
        write_json(args.json, scale, measured, outcomes, args)
    sim_errors = predict(scale, args, model, outcomes) if args.cost is not None else None
    report(outcomes, measured, tier_note, "dry-run" if args.dry_run_cpu else args.scale, sim_errors)


def write_json(
    path: Path, scale: Scale, measured: Probe, outcomes: dict[str, AgentOutcome], args: argparse.Namespace
) -> None:
    """The workload, the probe, the profiled cost model (with ``--predict``), the tier's room and copy cost,
    and each setting's figures and engine steps (what a simulator calibration compares with)."""
    figures = {
        name: {
            "turns_per_s": o.turns_per_s,
            "sessions_per_s": o.sessions_per_s,
            "ttft_p50_s": o.ttft(0.5),
            "ttft_p99_s": o.ttft(0.99),
            "reuse_of_perfect": o.reuse_of_perfect,
            "reprefill_per_turn": o.reprefill_per_turn,
            "preemptions": o.preemptions,
            "hung_s": o.hung_s,
            "hangs": o.hangs,
            "max_wait_s": o.max_hold_s,
            "turns": o.turns,
            "wall_s": o.wall_s,
            "step_fields": list(StepRecord._fields),
            "steps": [list(step) for step in o.steps],
        }
        for name, o in outcomes.items()
    }
    cost = args.cost.as_dict() if args.cost is not None else None
    tier = {"tokens": args.tier_tokens, "copy_s_per_token": args.tier_copy_s}
    document = {"scale": asdict(scale), "probe": asdict(measured), "settings": figures, "cost_model": cost,
                "tier": tier}  # fmt: skip
    path.write_text(json.dumps(document, indent=1))


def _with_knobs(scale: Scale, args: argparse.Namespace) -> Scale:
    workload = scale.workload
    if args.sessions is not None:
        workload = replace(workload, sessions=args.sessions)
    if args.turns is not None:
        lo, _, hi = args.turns.partition("-")
        workload = replace(workload, turns=(int(lo), int(hi or lo)))
    return replace(
        scale,
        workload=workload,
        budget_s=scale.budget_s if args.budget_s is None else args.budget_s,
        instances=scale.instances if args.instances is None else args.instances,
        kv_blocks=scale.kv_blocks if args.kv_blocks is None else args.kv_blocks,
    )


if __name__ == "__main__":
    main()
