"""A real run, read back from its event log: measured throughput, and the trainer and sync models.

The measured throughput is counted exactly as the simulator counts its own (``steady_throughput``):
trajectories trained in steps 2..K over the time between the trainer's progress events of steps 1
and K, where K is the run's ``trainer.total_steps`` (buffers handed over before the run ended may
still be trained after it; those steps run without rollout and are left out).

The trainer model comes from the same events: each step's ``train.progress`` ``step_s`` against
the response tokens of its ``train.batch``, fitted as ``step_s = a + b * tokens`` by least squares
(``b`` >= 0). ``publish_s`` is the median gap between a step's progress event and the parameter
server's ``wt.published`` of that version; pulls are drawn from the measured ``wt.loaded`` ``load_ms``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bus.eventlog import EventLogReader
from bus.messages import RoutingRecord, TrainBatch, TrainerProgress, WeightsLoaded, WeightsPublished
from psrl.config import Config, load_config
from psrl.errors import ConfigError, ConfigProblem
from psrl.sim.models import PullModel, TrainerModel
from psrl.sim.stats import TrainedStep, steady_throughput, window_throughput


@dataclass
class RunLog:
    config: Config
    steps: list[TrainedStep] = field(default_factory=list)  # end_s counted from the first logged event
    pull_s: list[float] = field(default_factory=list)
    publish_delays_s: list[float] = field(default_factory=list)
    first_dispatch_s: float = 0.0  # the first routed request (router.decision), from the first logged event

    @property
    def total_steps(self) -> int:
        return self.config.trainer.total_steps

    def throughput(self) -> tuple[float, float]:
        """Measured (trajectories/s, tokens/s) over steps 2..trainer.total_steps."""
        return steady_throughput(self.steps, self.total_steps)

    def window_throughput(self) -> float:
        """Measured trajectories/s of steps 1..K from the first routed request (``psrl report``'s figure)."""
        return window_throughput(self.steps, self.total_steps, self.first_dispatch_s)

    def trainer_model(self) -> TrainerModel:
        kept = [s for s in self.steps if s.step <= self.total_steps]
        if not kept:
            raise _problem("the run trained no step: nothing to calibrate the trainer from")
        tokens = np.array([s.num_tokens for s in kept], dtype=float)
        seconds = np.array([s.train_s for s in kept], dtype=float)
        step_s, token_s = float(np.mean(seconds)), 0.0  # the least-squares fit with no token term
        if len(kept) >= 3 and np.ptp(tokens) > 0:
            slope, intercept = np.polyfit(tokens, seconds, 1)
            if slope > 0 and intercept >= 0:
                step_s, token_s = float(intercept), float(slope)
        publish = max(0.0, statistics.median(self.publish_delays_s)) if self.publish_delays_s else 0.0
        return TrainerModel(step_s=step_s, token_s=token_s, publish_s=publish)

    def pull_model(self) -> PullModel:
        """The measured pulls as an empirical distribution."""
        if not self.pull_s:
            raise _problem("the run logged no weight pull (wt.loaded): nothing to calibrate the sync from")
        return PullModel(tuple(self.pull_s))


def read_run(run_dir: str | Path) -> RunLog:
    """Read ``run_dir/config.yaml`` and the training, publish and pull events of ``run_dir/events``."""
    run = Path(run_dir)
    if not (run / "config.yaml").is_file() or not (run / "events").is_dir():
        raise _problem(f"{run} is not a run directory (needs config.yaml and events/)")
    log = RunLog(load_config(str(run / "config.yaml"), []))
    batches: dict[int, TrainBatch] = {}
    progress: dict[int, tuple[int, TrainerProgress]] = {}
    published: dict[int, int] = {}
    first_ns: int | None = None
    dispatch_ns: int | None = None
    for logged in EventLogReader(run / "events").events():
        event, mono = logged.event, logged.event.envelope.mono_ns
        first_ns = mono if first_ns is None else min(first_ns, mono)
        message = event.message
        if isinstance(message, TrainBatch):
            batches.setdefault(message.step, message)
        elif isinstance(message, TrainerProgress) and event.envelope.sender == "trainer-0":
            progress.setdefault(message.step, (mono, message))
        elif isinstance(message, WeightsPublished):
            published.setdefault(message.version, mono)
        elif isinstance(message, WeightsLoaded):
            log.pull_s.append(message.load_ms / 1000)
        elif isinstance(message, RoutingRecord):
            dispatch_ns = mono if dispatch_ns is None else min(dispatch_ns, mono)
    origin = first_ns or 0
    log.first_dispatch_s = ((dispatch_ns or origin) - origin) / 1e9
    for step, (mono, prog) in sorted(progress.items()):
        batch = batches.get(step)
        if batch is None:
            continue
        log.steps.append(
            TrainedStep(step, (mono - origin) / 1e9, batch.num_trajectories, batch.num_tokens, prog.step_s)
        )
        if prog.version in published:
            log.publish_delays_s.append((published[prog.version] - mono) / 1e9)
    return log


def _problem(message: str) -> ConfigError:
    return ConfigError([ConfigProblem(("run",), "", message, "point at the directory of a finished psrl launch")])
