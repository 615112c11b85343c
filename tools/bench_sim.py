#!/usr/bin/env python3
"""The simulator at scale: psrl async against synchronous training at 64 instances, and 1,024 instances.

    .venv/bin/python tools/bench_sim.py              # speedup sweep + settings table at 64 instances (minutes)
    .venv/bin/python tools/bench_sim.py --quick      # the sweep only, 16 instances
    .venv/bin/python tools/bench_sim.py --scale      # also 1,024 instances / 100k+ requests, timed

Workload: bench_e2e's long-tail workload (log-normal response lengths, median 48, sigma 1, at most
400 tokens, engines of 32 sequences) on the demo preset, with the staleness buffer scaled with the
fleet so every instance gets the demo's share of each buffer (the demo preset's groups per buffer
over its instances). Engines run on the shipped CPU fit of the demo model
(``psrl/sim/demo_cost_model.json``).

Trainer: the demo's trainer as measured on this machine (``psrl/sim/demo_run_models.json``: one
trainer for two instances), made data parallel with the fleet (one trainer rank per two instances,
so the per-token time is divided by instances / 2) and then ``f`` times faster. ``f = 1`` is the
demo's own balance between training and rollout; larger ``f`` is a trainer that is fast next to
rollout, as on GPUs where decode is memory-bound and training is not. The sweep prints the speedup
of psrl (staleness 2, partial rollout, the reasoning profile) over synchronous training for each
``f``; the settings table (routing methods and sync settings) uses ``--table-factor``.

The last line is ``RESULT speedup_vs_sync=<f=1> speedup_f4=... speedup_f16=... ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.config import load_config
from psrl.log import configure
from psrl.sim.defaults import DEMO_COST_MODEL, demo_cost_model, load_run_models
from psrl.sim.models import SimSettings, TrainerModel
from psrl.sim.report import legend, summary_table
from psrl.sim.scenarios import PSRL, SYNC, Variant, comparison
from psrl.sim.simulation import simulate
from psrl.sim.stats import SimSummary

WORKLOAD = [
    "task.response_lengths=long_tail",
    "task.long_tail_median=48",
    "task.long_tail_sigma=1.0",
    "task.max_response_length=400",
    "engine.max_num_seqs=32",
    f"psrl.rollout_coordination.routing_strategy.cost_model_path={DEMO_COST_MODEL}",
]
FACTORS = (1, 4, 16)


def groups_per_instance() -> int:
    """The demo preset's share of a staleness buffer per rollout instance (prompt groups)."""
    demo = load_config("demo", [])
    return max(1, demo.psrl.staleness_buffer_entries // demo.topology.n_rollout_instances)


def trainer_for(num_instances: int, factor: float) -> TrainerModel:
    base, _ = load_run_models()
    ranks = num_instances / 2
    return TrainerModel(base.step_s / factor, base.token_s / ranks / factor, base.publish_s)


def run(variant: Variant, num_instances: int, steps: int, factor: float, extra: list[str]) -> SimSummary:
    overrides = [*WORKLOAD, f"psrl.staleness_buffer_entries={groups_per_instance() * num_instances}",
                 f"trainer.total_steps={steps}", *extra, *variant.overrides]  # fmt: skip
    _, pull = load_run_models()
    settings = SimSettings(trainer_for(num_instances, factor), pull, num_instances=num_instances)
    return simulate(load_config("demo", overrides), demo_cost_model(), settings, variant.label)


def sweep(num_instances: int, steps: int) -> dict[float, tuple[SimSummary, SimSummary]]:
    results = {}
    print(f"speedup of psrl over synchronous training, {num_instances} instances, {steps} steps")
    print(f"{'trainer f':>9} {'train s/step':>12} {'sync traj/s':>11} {'psrl traj/s':>11} {'speedup':>7} "
          f"{'sync busy':>9} {'psrl busy':>9} {'psrl tr.idle':>12} {'viol':>4}")  # fmt: skip
    for factor in FACTORS:
        sync = run(SYNC, num_instances, steps, factor, [])
        psrl = run(PSRL, num_instances, steps, factor, [])
        results[factor] = (sync, psrl)
        speedup = psrl.trajectories_per_s / sync.trajectories_per_s
        print(f"{factor:>9} {psrl.mean_train_s:>12.3f} {sync.trajectories_per_s:>11.1f} "
              f"{psrl.trajectories_per_s:>11.1f} {speedup:>6.2f}x {sync.instance_busy:>9.0%} "
              f"{psrl.instance_busy:>9.0%} {psrl.trainer_idle:>12.0%} "
              f"{sync.num_bound_violations + psrl.num_bound_violations:>4}")  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the sweep only, 16 instances, 8 steps")
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--table-factor", type=float, default=16, help="trainer factor of the settings table")
    parser.add_argument("--scale", action="store_true", help="also time 1,024 instances and 100k+ requests")
    args = parser.parse_args()
    configure("warning")
    instances, steps = (16, 8) if args.quick else (args.instances, args.steps)
    results = sweep(instances, steps)
    violations = sum(s.num_bound_violations + p.num_bound_violations for s, p in results.values())
    if not args.quick:
        print(f"\nrouting and sync settings, {instances} instances, trainer f={args.table_factor:g}")
        rows = [run(v, instances, steps, args.table_factor, []) for v in comparison("all")]
        for line in summary_table(rows):
            print(line)
        print(legend())
        violations += sum(r.num_bound_violations for r in rows)
    fields = [f"speedup_vs_sync={_speedup(results[1]):.2f}"]
    fields += [f"speedup_f{f}={_speedup(results[f]):.2f}" for f in FACTORS[1:]]
    fields += [f"instances={instances}", f"psrl_busy_f1={results[1][1].instance_busy:.2f}",
               f"psrl_trainer_idle_f1={results[1][1].trainer_idle:.2f}"]  # fmt: skip
    if args.scale:
        scale = scale_run()
        fields += [f"scale_instances={scale.num_instances}", f"scale_requests={scale.num_requests}",
                   f"scale_wall_s={scale.wall_s:.0f}", f"scale_decisions={scale.num_routing_decisions}"]  # fmt: skip
        violations += scale.num_bound_violations
    print("RESULT " + " ".join([*fields, f"violations={violations}"]))


def scale_run() -> SimSummary:
    """1,024 instances, the reasoning profile, 8 buffers of 4,096 groups of 4 dispatched (131,072 requests)."""
    print("\nscale: 1,024 instances (psrl reasoning profile, trainer f=16)")
    summary = run(PSRL, 1024, 6, 16, ["psrl.staleness_buffer_entries=4096", "psrl.rollout_n=4"])
    for line in summary_table([summary]):
        print(line)
    print(f"  {summary.num_requests} requests, {summary.num_routing_decisions} routings, "
          f"{summary.sim_s:.1f} simulated s in {summary.wall_s:.0f} wall s")  # fmt: skip
    return summary


def _speedup(pair: tuple[SimSummary, SimSummary]) -> float:
    sync, psrl = pair
    return psrl.trajectories_per_s / sync.trajectories_per_s if sync.trajectories_per_s else 0.0


if __name__ == "__main__":
    main()
