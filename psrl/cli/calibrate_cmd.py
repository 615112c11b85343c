"""`psrl calibrate [PRESET] [OVERRIDES...] --output cost_model.json`: fit the router's cost model.

Builds the configured embedded engine in this process, times its decode steps over a grid of
batch sizes and KV usages (`psrl.sim.profiling`), fits ``k1..k4`` (and the prefill cost) by least
squares (`psrl.engine_cost.fit`) and writes the JSON that
``psrl.rollout_coordination.routing_strategy.cost_model_path`` points at.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Any

import click

from psrl.config.loader import split_preset
from psrl.errors import ConfigError

EPILOG = """\b
Examples:
  psrl calibrate --output cost_model.json              the demo model, default grid
  psrl calibrate demo engine.max_num_seqs=32 --quick   a smaller grid (tests, smoke checks)
  psrl calibrate my.yaml --samples steps.jsonl         also keep the profiled steps
"""


@click.command(epilog=EPILOG)
@click.argument("args", nargs=-1)
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=Path("cost_model.json"),
              show_default=True, help="Cost-model JSON to write.")  # fmt: skip
@click.option("--quick", is_flag=True, help="A small grid with few steps per point (seconds instead of minutes).")
@click.option("--samples", type=click.Path(dir_okay=False, path_type=Path), help="Also write the profiled steps.")
@click.option("--threads", type=int, default=None, help="torch threads (default: topology.threads_per_actor).")
@click.option("--repeats", type=int, default=None, help="Passes over the grid (default: 3, quick: 1).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random profiling prompts.")
def calibrate(
    args: tuple[str, ...],
    output: Path,
    quick: bool,
    samples: Path | None,
    threads: int | None,
    repeats: int | None,
    seed: int,
) -> None:
    """Profile the configured engine and fit the throughput_optimal / hypothesis_test cost model."""
    from psrl.config import load_config

    preset, overrides = split_preset(args)
    try:
        config = load_config(preset or "demo", overrides)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    if repeats is not None and repeats < 1:
        raise click.BadParameter("must be >= 1", param_hint="--repeats")
    if config.engine.backend != "embedded":
        click.echo("psrl calibrate profiles the embedded engine; run it with engine.backend=embedded "
                   f"(this config sets engine.backend={config.engine.backend})", err=True)  # fmt: skip
        sys.exit(2)
    _run(config, output, quick=quick, samples_path=samples, threads=threads, repeats=repeats, seed=seed)


def _run(
    config: Any, output: Path, *, quick: bool, samples_path: Path | None, threads: int | None,
    repeats: int | None, seed: int,
) -> None:  # fmt: skip
    import dataclasses

    import torch

    from psrl.engine import Engine, EngineArgs
    from psrl.engine_cost.fit import fit_cost_model, save_samples
    from psrl.engine_cost.model import CostModelError
    from psrl.sim.profiling import EngineLimits, ProfileGrid, grid_points, point_table, profile_engine

    num_threads = config.topology.threads_per_actor if threads is None else threads
    if num_threads > 0:
        torch.set_num_threads(num_threads)
    grid = ProfileGrid.quick() if quick else ProfileGrid.default()
    if repeats is not None:
        grid = dataclasses.replace(grid, num_repeats=repeats)
    engine = Engine(EngineArgs.from_config(config))
    limits = EngineLimits.of(engine)
    points = grid_points(grid, limits)
    click.echo(
        f"profiling {engine.args.model_path} on {engine.device} ({engine.dtype}, {torch.get_num_threads()} threads): "
        f"{len(points)} points x {grid.num_repeats} x {grid.num_timed_steps} steps, "
        f"KV capacity {limits.kv_capacity_tokens} tokens, max_num_seqs {limits.max_num_seqs}"
    )
    started = time.monotonic()
    results, prefill = profile_engine(engine, grid, seed=seed)
    decode = [r.sample for r in results]
    try:
        report = fit_cost_model([*decode, *prefill], meta=_meta(engine, limits, grid, num_threads))
    except CostModelError as exc:
        raise click.ClickException(f"cannot fit the cost model: {exc}") from exc
    for row in point_table(results, report.model.step_time, limits.kv_capacity_tokens):
        click.echo(row)
    _write(report, output)
    if samples_path is not None:
        save_samples([*decode, *prefill], samples_path)
    click.echo(report.summary())
    click.echo(
        f"fit error: rmse {report.rmse_s * 1e3:.3f} ms, mean abs error {report.mean_abs_pct_error:.1%}, "
        f"r2 {report.r2:.3f} over {report.num_samples} points ({time.monotonic() - started:.0f} s of profiling)"
    )
    click.echo(f"wrote {output}")


def _write(report: Any, output: Path) -> None:
    """Save the model with its fit error in ``meta`` (so a reader can judge how far to trust it)."""
    import dataclasses

    model = report.model
    meta = {**model.meta, "rmse_s": report.rmse_s, "mean_abs_pct_error": report.mean_abs_pct_error, "r2": report.r2}
    output.parent.mkdir(parents=True, exist_ok=True)
    dataclasses.replace(model, meta=meta).save(output)


def _meta(engine: Any, limits: Any, grid: Any, num_threads: int) -> dict[str, Any]:
    return {
        "model": str(engine.args.model_path),
        "device": str(engine.device),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "threads": num_threads,
        "host": platform.node(),
        "kv_capacity_tokens": limits.kv_capacity_tokens,
        "max_num_seqs": limits.max_num_seqs,
        "grid": {
            "batch_sizes": list(grid.batch_sizes),
            "kv_fractions": list(grid.kv_fractions),
            "timed_steps": grid.num_timed_steps,
            "repeats": grid.num_repeats,
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
