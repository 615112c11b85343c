"""``python -m psrl.sim [PRESET] [OVERRIDES...]``: simulate runs, compare settings, validate against real runs."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

from psrl.config import Config, load_config
from psrl.config.loader import split_preset
from psrl.engine_cost.model import CostModelError, load_cost_model
from psrl.errors import ConfigError
from psrl.sim.defaults import DEMO_COST_MODEL, load_run_models
from psrl.sim.events import SimulationError
from psrl.sim.models import PullModel, SimSettings, TrainerModel
from psrl.sim.report import legend, summary_table, validation_table
from psrl.sim.runlog import read_run
from psrl.sim.scenarios import PSRL, SYNC, Variant, comparison
from psrl.sim.simulation import simulate
from psrl.sim.stats import SimSummary
from psrl.sim.validate import validate_run

COST_PATH_KEY = "psrl.rollout_coordination.routing_strategy.cost_model_path"

EPILOG = """\b
Examples:
  python -m psrl.sim                                       the demo, simulated (long-tail lengths)
  python -m psrl.sim demo --instances 64 --compare all     routing and sync settings vs synchronous
  python -m psrl.sim --validate runs/demo-run              simulated vs measured on a real run
  python -m psrl.sim reasoning psrl.staleness=1 --instances 1024 --prompt-tokens 32

\b
The base config is PRESET (default demo) with task.response_lengths=long_tail, then OVERRIDES.
Engines run on --cost-model (default: the config's cost_model_path, else the shipped CPU fit of
the demo model); the trainer and the weight pulls come from --from-run RUN (a real run's log) or
the shipped demo calibration, each adjustable with the --trainer-*, --publish-s and --pull-s options.
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("args", nargs=-1)
@click.option("--instances", type=click.IntRange(min=1), help="Rollout instances (default: topology).")
@click.option("--steps", type=click.IntRange(min=2), help="Training steps to simulate (default: trainer.total_steps).")
@click.option("--compare", type=click.Choice(["sync", "routing", "all", "agentic"]),
              help="Print a comparison table (agentic: the agentic profile's settings).")  # fmt: skip
@click.option("--cost-model", type=click.Path(dir_okay=False, path_type=Path), help="Engine cost model JSON.")
@click.option("--from-run", type=click.Path(file_okay=False, path_type=Path), help="Trainer and pulls from a run.")
@click.option("--trainer-step-s", type=float, help="Trainer seconds per step (fixed part).")
@click.option("--trainer-token-s", type=float, help="Trainer seconds per trained response token.")
@click.option("--publish-s", type=float, help="Seconds from a trained step to the published version.")
@click.option("--pull-s", type=float, help="Seconds of every weight pull (instead of measured pulls).")
@click.option("--prompt-tokens", type=click.IntRange(min=1), help="Fixed prompt length (skip tokenizing prompts).")
@click.option("--observation-tokens", type=click.IntRange(min=0), default=32, show_default=True,
              help="Tokens of each modelled environment reply (sessions: how fast contexts grow).")  # fmt: skip
@click.option(
    "--engine-slowdown",
    type=float,
    default=1.0,
    show_default=True,
    help="Engine steps take this many times the cost model's time (what-if: shared or slower hardware).",
)
@click.option("--context-limit", type=click.IntRange(min=2), help="Context limit in tokens (default: the model's).")
@click.option("--validate", "validate_runs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Simulate a real run's config and compare throughputs (repeatable); trainer and pulls from "
                   "each run's own log, or from --from-run.")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write results.")
def main(
    args: tuple[str, ...],
    instances: int | None,
    steps: int | None,
    compare: str | None,
    cost_model: Path | None,
    from_run: Path | None,
    trainer_step_s: float | None,
    trainer_token_s: float | None,
    publish_s: float | None,
    pull_s: float | None,
    prompt_tokens: int | None,
    observation_tokens: int,
    context_limit: int | None,
    engine_slowdown: float,
    validate_runs: tuple[Path, ...],
    json_path: Path | None,
) -> None:
    """Discrete-event simulation of psrl runs driving the real routing, staleness and coordination code."""
    try:
        if validate_runs:
            _validate(validate_runs, cost_model, from_run, engine_slowdown, json_path)
            return
        preset, overrides = split_preset(args)
        cost_path, extra = _cost_path(preset, overrides, cost_model)
        base = [*overrides, *extra]
        cost = load_cost_model(cost_path)
        trainer, pull = _run_models(from_run, trainer_step_s, trainer_token_s, publish_s, pull_s)
        settings = SimSettings(trainer, pull, num_instances=instances, total_steps=steps, prompt_tokens=prompt_tokens,
                               context_limit=context_limit, engine_slowdown=engine_slowdown,
                               observation_tokens=observation_tokens)  # fmt: skip
        variants = comparison(compare) if compare else [Variant(preset or "demo", ())]
        rows = [simulate(_config(preset, [*base, *v.overrides]), cost, settings, v.label) for v in variants]
    except (ConfigError, CostModelError, SimulationError) as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    for line in summary_table(rows):
        click.echo(line)
    click.echo(legend())
    if json_path is not None:
        json_path.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1) + "\n")
    click.echo(_result_line(rows, settings))


def _config(preset: str | None, overrides: list[str]) -> Config:
    return load_config(preset or "demo", ["task.response_lengths=long_tail", *overrides])


def _cost_path(preset: str | None, overrides: list[str], explicit: Path | None) -> tuple[Path, list[str]]:
    """The engines' cost model, and the overrides that give the decision code a cost model if none is set."""
    try:
        configured = _config(preset, overrides).psrl.rollout_coordination.routing_strategy.cost_model_path
    except ConfigError:  # e.g. throughput_optimal without a cost model: it gets the engines' one (other
        configured = None  # problems are reported when the config is loaded with it)
    path = explicit or (Path(configured) if configured else DEMO_COST_MODEL)
    return path, [] if configured else [f"{COST_PATH_KEY}={path}"]


def _run_models(
    from_run: Path | None, step_s: float | None, token_s: float | None, publish_s: float | None, pull_s: float | None
) -> tuple[TrainerModel, PullModel]:
    if from_run is not None:
        log = read_run(from_run)
        trainer, pull = log.trainer_model(), log.pull_model()
    else:
        trainer, pull = load_run_models()
    trainer = TrainerModel(
        trainer.step_s if step_s is None else step_s,
        trainer.token_s if token_s is None else token_s,
        trainer.publish_s if publish_s is None else publish_s,
    )
    return trainer, pull if pull_s is None else PullModel.constant(pull_s)


def _result_line(rows: list[SimSummary], settings: SimSettings) -> str:
    violations = sum(r.num_bound_violations for r in rows)
    by_label = {r.label: r for r in rows}
    sync, psrl = by_label.get(SYNC.label), by_label.get(PSRL.label)
    if sync is not None and psrl is not None and sync.trajectories_per_s > 0:
        speedup = psrl.trajectories_per_s / sync.trajectories_per_s
        return (
            f"RESULT speedup_vs_sync={speedup:.2f} instances={psrl.num_instances} "
            f"psrl_traj_per_s={psrl.trajectories_per_s:.2f} sync_traj_per_s={sync.trajectories_per_s:.2f} "
            f"psrl_busy={psrl.instance_busy:.2f} psrl_trainer_idle={psrl.trainer_idle:.2f} violations={violations}"
        )
    first = rows[0]
    return (
        f"RESULT traj_per_s={first.trajectories_per_s:.2f} instances={first.num_instances} "
        f"requests={first.num_requests} wall_s={first.wall_s:.1f} violations={violations}"
    )


def _validate(
    runs: tuple[Path, ...], cost_model: Path | None, from_run: Path | None, slowdown: float, json_path: Path | None
) -> None:
    cost = load_cost_model(cost_model or DEMO_COST_MODEL)
    validations = [validate_run(run, cost, from_run, slowdown) for run in runs]
    for line in validation_table(validations):
        click.echo(line)
    if json_path is not None:
        data = [{"run": v.run_dir, "measured_per_s": v.measured_per_s, "ratio": v.ratio,
                 "measured_window_per_s": v.measured_window_per_s, "window_ratio": v.window_ratio,
                 "summary": dataclasses.asdict(v.summary)} for v in validations]  # fmt: skip
        json_path.write_text(json.dumps(data, indent=1) + "\n")
    worst = max(abs(v.ratio - 1.0) for v in validations)
    worst_window = max(abs(v.window_ratio - 1.0) for v in validations)
    ratios = ",".join(f"{v.ratio:.3f}" for v in validations)
    violations = sum(v.summary.num_bound_violations for v in validations)
    click.echo(
        f"RESULT sim_vs_measured_max_error={worst:.3f} window_max_error={worst_window:.3f} ratios={ratios} "
        f"violations={violations}"
    )
