"""Simulated against measured: replay a real run's configuration in the simulator.

The simulator gets the run's own resolved config (``config.yaml``), its engines' cost model from
``psrl calibrate`` (never from the run), and the trainer and pull models from the run's event log
(``psrl.sim.runlog``). Both throughputs are counted the same way. The per-step breakdown splits
the time between two trained steps into training and the trainer's wait for its next buffer
(rollout, sync and hand-over), so a gap can be traced to one side.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from psrl.engine_cost.model import CostModel
from psrl.sim.models import SimSettings
from psrl.sim.runlog import read_run
from psrl.sim.simulation import Simulation
from psrl.sim.stats import SimSummary, TrainedStep


@dataclass(frozen=True)
class StepBreakdown:
    train_s: float  # mean training time per step (steps 2..K)
    wait_s: float  # mean time between steps not spent training


@dataclass(frozen=True)
class Validation:
    run_dir: str
    measured_per_s: float
    measured_tokens_per_s: float
    measured_window_per_s: float
    measured: StepBreakdown
    simulated: StepBreakdown
    summary: SimSummary

    @property
    def ratio(self) -> float:
        """simulated / measured trajectories per second (steady: steps 2..K)."""
        return self.summary.trajectories_per_s / self.measured_per_s if self.measured_per_s else float("inf")

    @property
    def window_ratio(self) -> float:
        """simulated / measured trajectories per second over the work window (``psrl report``'s figure)."""
        measured = self.measured_window_per_s
        return self.summary.window_trajectories_per_s / measured if measured else float("inf")


def breakdown(steps: list[TrainedStep], last_step: int) -> StepBreakdown:
    kept = sorted((s for s in steps if s.step <= last_step), key=lambda s: s.step)
    pairs = list(itertools.pairwise(kept))
    if not pairs:
        return StepBreakdown(0.0, 0.0)
    train = sum(b.train_s for _, b in pairs) / len(pairs)
    interval = sum(b.end_s - a.end_s for a, b in pairs) / len(pairs)
    return StepBreakdown(train, max(0.0, interval - train))


def validate_run(
    run_dir: str | Path, cost: CostModel, calibration_run: str | Path | None = None, engine_slowdown: float = 1.0
) -> Validation:
    """Simulate ``run_dir``'s config; trainer and pulls from its own log, or from ``calibration_run``'s
    (a prediction of one run from another)."""
    log = read_run(run_dir)
    per_s, tokens_per_s = log.throughput()
    if per_s <= 0:
        raise ValueError(f"{run_dir}: fewer than two trained steps before the run ended; nothing to compare")
    source = log if calibration_run is None else read_run(calibration_run)
    settings = SimSettings(source.trainer_model(), source.pull_model(), engine_slowdown=engine_slowdown)
    simulation = Simulation(log.config, cost, settings, label=Path(run_dir).name)
    summary = simulation.run()
    return Validation(
        str(run_dir), per_s, tokens_per_s, log.window_throughput(), breakdown(log.steps, log.total_steps),
        breakdown(simulation.stats.steps, log.total_steps), summary,
    )  # fmt: skip
