#!/usr/bin/env python3
"""Learning quality against staleness: synchronous vs asynchronous training at equal steps, on the demo.

    .venv/bin/python tools/study_async.py            # 5 settings x 3 seeds, the demo's 80 steps
    .venv/bin/python tools/study_async.py --quick    # 5 settings x 1 seed, 30 steps
    .venv/bin/python tools/study_async.py --eval-cost --steps 30 --eval-interval 5 --seeds 1   # what eval costs

Settings (all on the demo preset: GRPO, partial rollout, 2 instances, 1 trainer):

    sync      psrl.staleness=0 (exactly synchronous), token-level TIS
    s1_tis    staleness 1 with token-level TIS (threshold 2)
    s2_tis    staleness 2 with TIS (the demo itself)
    s3_tis    staleness 3 with TIS
    s2_none   staleness 2 without any correction (no importance weights)

The rollout-correction family at staleness 8 (docs/studies/rollout_correction.md):

    s8_none    no correction
    s8_tis     token-level TIS (threshold 2)
    s8_icepop  IcePop: tokens whose ratio pi_old / pi_rollout leaves [0.5, 5] are masked
    s8_seqmis  sequence MIS: sequence-level weights truncated at 2, responses outside [0.5, 2] masked
    s8_gspo    the GSPO loss (sequence ratio, clip 3e-4 / 4e-4), no rollout weights

``--correction-plot`` writes, per setting, held-out accuracy over versions, the sampler-trainer
KL (k3) and the masked token fraction over steps; ``--json`` then also carries those curves.

``--config FILE`` runs the settings on another preset or YAML file instead of the demo (e.g.
``examples/reasoning_gym/word_reversal.yaml``: its task, model and sizes, with each setting's
staleness and correction on top).

Every run evaluates on its task's held-out split (greedy exact match and pass@k) at version 0,
every ``--eval-interval`` versions and at the last version. Seeds vary the prompt stream, the
rollout sampling and the trainer (the held-out prompts are the same for every seed). The table
gives, per setting, the final held-out accuracy (mean ± spread over seeds), pass@k, the gain over
version 0, the gap to synchronous (points), training wall time (first dispatch to last step) and
its speedup over synchronous, and from the staleness certificates the mean staleness, the
fraction of importance weights clipped and the mean trained response length. Wall times are
measured in this same study, so the speedups are ratios on the same (possibly loaded) machine.

The last line is ``RESULT acc_gap_s2_tis=<sync - s2, points> speedup_s2=<ratio> ...``; ``--plot``
writes eval accuracy over versions for each setting (mean over seeds, band = min..max).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psrl.evaluation.study import StudyRun, result_line, summarize, table

RC = "algorithm.rollout_correction."
S8 = ["psrl.staleness=8"]
SETTINGS: dict[str, list[str]] = {
    "sync": ["psrl.staleness=0"],
    "s1_tis": ["psrl.staleness=1"],
    "s2_tis": ["psrl.staleness=2"],
    "s3_tis": ["psrl.staleness=3"],
    "s2_none": ["psrl.staleness=2", "algorithm.rollout_correction.rollout_is=null"],
    # the rollout-correction family at staleness 8 (see docs/studies/rollout_correction.md)
    "s8_none": [*S8, f"{RC}rollout_is=null"],
    "s8_tis": [*S8],
    "s8_icepop": [
        *S8,
        f"{RC}rollout_is=null",
        f"{RC}rollout_rs=token",
        f"{RC}rollout_rs_threshold=5",
        f"{RC}rollout_rs_threshold_lower=0.5",
    ],
    "s8_seqmis": [
        *S8,
        f"{RC}rollout_is=sequence",
        f"{RC}rollout_rs=sequence",
        f"{RC}rollout_rs_threshold=2",
        f"{RC}rollout_rs_threshold_lower=0.5",
    ],
    "s8_gspo": [
        *S8,
        f"{RC}rollout_is=null",
        "algorithm.policy_loss.loss_mode=gspo",
        "algorithm.loss_agg_mode=seq-mean-token-mean",
    ],
}


def overrides(args: argparse.Namespace, setting: str, seed: int, *, evaluate: bool = True) -> list[str]:
    evaluation = [f"trainer.eval_interval={args.eval_interval}", f"eval.num_prompts={args.eval_prompts}",
                  f"eval.k={args.k}"]  # fmt: skip
    return [
        f"trainer.total_steps={args.steps}",
        *(evaluation if evaluate else []),
        f"trainer.seed={seed}",
        f"task.seed={seed}",
        "trainer.save_freq=0",
        "trainer.keep_checkpoints=1",
        *SETTINGS[setting],
        *args.overrides,
    ]


# (setting, seed) -> metric -> per-step values of the trainer (the correction family's curves)
CURVES: dict[tuple[str, int], dict[str, list[float]]] = {}
CURVE_METRICS = ("rollout_corr/kl_k3", "rollout_corr/token_masked_frac", "rollout_corr/token_truncated_frac")


def trainer_curves(records: list[dict]) -> dict[str, list[float]]:
    """Per-step values of CURVE_METRICS from the trainer's records (the trainer also logs records of other
    metrics, e.g. its weight pushes, for the same steps: those are left out)."""
    steps = sorted((r for r in records if r["sender"].startswith("trainer") and CURVE_METRICS[0] in r["values"]),
                   key=lambda r: r["step"])  # fmt: skip
    return {name: [float(r["values"].get(name, np.nan)) for r in steps] for name in CURVE_METRICS}


def _steps_measured(curves: dict[str, list[float]]) -> dict[str, list[float]]:
    """The curves at the steps where the KL was measured (older --json files interleave other records)."""
    keep = [i for i, v in enumerate(curves[CURVE_METRICS[0]]) if np.isfinite(v)]
    return {name: [values[i] for i in keep] for name, values in curves.items()}


def one_run(args: argparse.Namespace, setting: str, seed: int) -> StudyRun:
    import psrl
    from psrl.report.collect import read_timeline

    started = time.monotonic()
    result = psrl.run(args.config, overrides(args, setting, seed), name=f"{setting}_seed{seed}", root=args.root)
    if not result.ok:
        raise SystemExit(f"{setting} seed {seed} failed: {result.reason} ({result.run_dir})")
    records = result.metrics()
    evals = [r["values"] for r in records if "eval/acc" in r["values"]]
    curve = {int(v["eval/version"]): float(v["eval/acc"]) for v in evals}
    last = max(evals, key=lambda v: v["eval/version"])
    line = read_timeline(result.run_dir)
    ends = [p.time for p in line.progress if p.step <= args.steps]
    wall = max(ends) - line.first_dispatch if ends and line.first_dispatch is not None else float("nan")
    certs = line.certificates
    staleness = [s for c in certs for s in c.staleness]
    clipped = [x for c in certs for x in c.is_clipped_frac if np.isfinite(x)]
    lengths = [r["values"]["response_length/mean"] for r in records if "response_length/mean" in r["values"]
               and r["sender"] == "coordinator"]  # fmt: skip
    CURVES[(setting, seed)] = trainer_curves(records)
    run = StudyRun(setting, seed, curve, float(last.get(f"eval/pass@{args.k}", np.nan)), wall, _mean(staleness),
                   _mean(clipped), _mean(lengths))  # fmt: skip
    print(
        f"  {setting:<8} seed {seed}: acc {100 * run.final_acc:.1f} (v0 {100 * curve.get(0, np.nan):.1f}) "
        f"wall {wall:.0f} s (run {time.monotonic() - started:.0f} s) {result.run_dir}",
        flush=True,
    )
    return run


def eval_cost(args: argparse.Namespace) -> None:
    """What evaluation costs training: s2_tis with and without it, alternating, same steps and seeds."""
    import psrl
    from psrl.report.collect import read_timeline

    walls: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(args.seeds):
        for evaluate in (False, True):
            name = f"cost_{'eval' if evaluate else 'none'}_{repeat}"
            result = psrl.run(args.config, overrides(args, "s2_tis", 0, evaluate=evaluate), name=name, root=args.root)
            if not result.ok:
                raise SystemExit(f"{name} failed: {result.reason}")
            line = read_timeline(result.run_dir)
            ends = [p.time for p in line.progress if p.step <= args.steps]
            walls[evaluate].append(max(ends) - (line.first_dispatch or min(ends)))
            print(f"  {name}: training wall {walls[evaluate][-1]:.0f} s", flush=True)
    with_eval, without = _mean(walls[True]), _mean(walls[False])
    rounds = args.steps // args.eval_interval + 1 + (args.steps % args.eval_interval > 0)
    samples = args.eval_prompts * (1 + args.k)
    print(f"RESULT eval_cost_ratio={with_eval / without:.3f} eval_rounds={rounds} eval_samples_per_round={samples} "
          f"wall_with={with_eval:.0f} wall_without={without:.0f}")  # fmt: skip


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def plot(runs: list[StudyRun], order: list[str], path: Path, task: str = "demo task") -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=110, layout="constrained")
    axes = figure.subplots()
    for name in order:
        group = [r for r in runs if r.setting == name]
        versions = sorted(set.intersection(*(set(r.curve) for r in group))) if group else []
        if not versions:
            continue
        values = np.asarray([[100 * r.curve[v] for v in versions] for r in group])
        (line,) = axes.plot(versions, values.mean(axis=0), marker="o", linewidth=2, label=name)
        if len(group) > 1:
            axes.fill_between(versions, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.15)
    axes.set_xlabel("version (training steps)")
    axes.set_ylabel("held-out exact-match accuracy (%, greedy)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.suptitle(f"{task}: held-out accuracy vs staleness (mean over seeds, band = min..max)")
    figure.savefig(path, format="png")


def plot_correction(runs: list[StudyRun], order: list[str], path: Path) -> None:
    """Held-out accuracy, sampler-trainer KL and masked fraction of each setting (mean over seeds)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 4), dpi=110, layout="constrained")
    acc_axes, kl_axes, mask_axes = figure.subplots(1, 3)
    for name in order:
        group = [r for r in runs if r.setting == name]
        versions = sorted(set.intersection(*(set(r.curve) for r in group))) if group else []
        if versions:
            acc = np.mean([[100 * r.curve[v] for v in versions] for r in group], axis=0)
            acc_axes.plot(versions, acc, marker="o", label=name)
        curves = [_steps_measured(CURVES[(r.setting, r.seed)]) for r in group if (r.setting, r.seed) in CURVES]
        for axes, metric in ((kl_axes, CURVE_METRICS[0]), (mask_axes, CURVE_METRICS[1])):
            length = min((len(c[metric]) for c in curves), default=0)
            if length:
                mean = np.nanmean([c[metric][:length] for c in curves], axis=0)
                axes.plot(range(1, length + 1), mean, label=name)
    acc_axes.set(xlabel="version", ylabel="held-out exact match (%, greedy)", title="accuracy")
    kl_axes.set(xlabel="step", ylabel="k3 KL(pi_rollout || pi_old)", title="sampler-trainer KL", yscale="log")
    mask_axes.set(xlabel="step", ylabel="fraction of trained tokens", title="masked by the correction")
    for axes in (acc_axes, kl_axes, mask_axes):
        axes.grid(True, alpha=0.3)
    acc_axes.legend(fontsize=8)
    figure.suptitle("demo task, rollout correction at staleness 8 (mean over seeds)")
    figure.savefig(path, format="png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 30 steps, 64 held-out prompts")
    parser.add_argument(
        "--config", default="demo", help="the preset or YAML file every setting overrides (default: the demo preset)"
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--eval-interval", type=int, default=20)
    parser.add_argument("--eval-prompts", type=int, default=128)
    parser.add_argument("-k", type=int, default=4, help="samples per prompt for pass@k")
    parser.add_argument(
        "--settings", default=",".join(SETTINGS), help="comma-separated subset of " + ",".join(SETTINGS)
    )
    parser.add_argument("--root", default="runs/study_async", help="where the runs are written")
    parser.add_argument("--plot", type=Path, help="write the accuracy-over-versions plot here (png)")
    parser.add_argument("--json", type=Path, help="write every run's numbers here")
    parser.add_argument("--correction-plot", type=Path, help="write accuracy, KL and masked fraction here (png)")
    parser.add_argument("--eval-cost", action="store_true",
                        help="instead: s2_tis with and without evaluation, --seeds times each (its cost)")  # fmt: skip
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first_seed .. first_seed + seeds - 1")
    parser.add_argument("--add", type=Path, nargs="*", default=[],
                        help="--json files of earlier invocations (other seeds) to count in the table")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) of every run, after its setting's")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.eval_interval, args.eval_prompts = 1, 30, 10, 64
    if args.eval_cost:
        eval_cost(args)
        return
    order = [s.strip() for s in args.settings.split(",")]
    unknown = [s for s in order if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; use {list(SETTINGS)}")
    started = time.monotonic()
    print(f"study: {order} x {args.seeds} seeds, {args.steps} steps, eval every {args.eval_interval} versions on "
          f"{args.eval_prompts} held-out prompts (greedy + {args.k} samples)", flush=True)  # fmt: skip
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    runs = [one_run(args, setting, seed) for seed in seeds for setting in order]
    if args.json:
        args.json.write_text(json.dumps([_to_json(r) for r in runs], indent=1))
    runs += [_from_json(item) for path in args.add for item in json.loads(path.read_text())]
    rows = summarize(runs, order)
    print()
    for line in table(rows, args.k):
        print(line)
    print(f"study wall time {time.monotonic() - started:.0f} s")
    if args.plot:
        plot(runs, order, args.plot, "demo task" if args.config == "demo" else Path(args.config).stem)
    if args.correction_plot:
        plot_correction(runs, order, args.correction_plot)
    print(result_line(rows))


def _to_json(run: StudyRun) -> dict[str, object]:
    curves = CURVES.get((run.setting, run.seed))
    extra = {} if curves is None else {"trainer_curves": curves}
    return {**run.__dict__, "curve": {str(v): a for v, a in run.curve.items()}, **extra}


def _from_json(item: dict[str, object]) -> StudyRun:
    values = dict(item)
    curves = values.pop("trainer_curves", None)
    if isinstance(curves, dict):
        CURVES[(str(values["setting"]), int(values["seed"]))] = curves  # type: ignore[call-overload]
    values["curve"] = {int(v): float(a) for v, a in dict(values["curve"]).items()}  # type: ignore[call-overload]
    return StudyRun(**values)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
