"""The Python API: start a run from a script or a notebook, exactly as `psrl launch` would.

    import psrl

    result = psrl.run("examples/digits/config.yaml", ["trainer.total_steps=10"])
    print(result.ok, result.run_dir)
    for step in result.steps():              # the training metrics of each step
        print(step["step"], step["reward/mean"], step["acc/mean"])

`result.metrics()` is every record of metrics.jsonl (the trainer's, weight syncs, evaluations too).

A running run gains or loses rollout instances with `psrl.scale(run_dir, "rollout=+2")` (the same
request as `psrl scale`, over the run's bus; `psrl.scale_request`), from another process or thread.

`config` is a preset name, a YAML path or a `psrl.config.Config` (e.g. from
`psrl.config.load_config`); `overrides` are `key=value` strings as on the command line. The same
checks as `psrl launch` run first (a `ConfigError` lists every problem), then the actors start on
this machine and the call returns when the run ends. Call it from the main thread: Ctrl-C (or
SIGTERM) stops the run after the trainer has saved a checkpoint. An existing `name` under `root`
is resumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from psrl.config import Config, load_config
from psrl.run_result import RunResult
from psrl.scale_request import ScaleResult, scale

__all__ = ["ScaleResult", "run", "scale"]


def run(
    config: Config | str = "demo",
    overrides: Sequence[str] = (),
    *,
    name: str | None = None,
    root: str | Path | None = None,
    quiet: bool = True,
) -> RunResult:
    """Check the configuration, run it on this machine (or where ``topology.cluster`` says) and return
    how it ended."""
    from launch.runner import run_launch
    from psrl.preflight import checked

    if isinstance(config, Config):
        resolved = load_config(None, overrides, base=config)
    else:
        resolved = load_config(config, overrides)
    cluster = resolved.topology.cluster
    resolved = checked(resolved, spans_hosts=cluster is not None)
    root_dir = None if root is None else str(root)
    if cluster is None:
        result = run_launch(resolved, None, name=name, root=root_dir, quiet=quiet)
    else:  # a Ray cluster or the Slurm allocation places the actors (a ClusterError: nothing started)
        from launch.cluster import open_cluster, parse_target

        with open_cluster(parse_target(cluster), resolved) as hosts:
            result = run_launch(resolved, hosts, name=name, root=root_dir, quiet=quiet)
    return RunResult(result.exit_code, result.reason, result.run_dir)
