"""What a simulated run measures, and its summary figures.

Throughput is counted the same way as for a real run (``psrl.sim.runlog``), in two ways:

* steady (the simulator's headline): trajectories (and response tokens) the trainer finished
  training in steps 2..K, over the time from the end of step 1 to the end of step K; step 1 is
  left out because it includes the start-up (the first buffer has to be generated before
  anything can be trained);
* work window (``psrl report``'s definition): every step 1..K over the time from the first routed
  request to the end of step K.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bus.messages import (
    FinishReason,
    GenerateRequest,
    Metrics,
    MigrateCommand,
    SyncCommand,
    TrainerProgress,
    TrajectoryDone,
)
from psrl.flows.effects import Effect, Publish, Send


@dataclass
class TrainedStep:
    step: int
    end_s: float
    num_trajectories: int
    num_tokens: int
    train_s: float


@dataclass
class SimStats:
    steps: list[TrainedStep] = field(default_factory=list)
    staleness: Counter[int] = field(default_factory=Counter)  # own count: buffer - V_traj of consumed trajectories
    ledger_staleness: Counter[int] = field(default_factory=Counter)  # the ledger's ConsumedBuffer histograms
    num_bound_violations: int = 0  # own check: V_traj <= b <= V_traj + eta broken
    num_token_version_violations: int = 0  # own check: a token's version outside [V_traj, b]
    num_ledger_violations: int = 0  # the ledger's own count
    num_trained: int = 0
    num_mixed_versions: int = 0  # trained trajectories whose tokens come from more than one version
    num_wasted_tokens: int = 0  # generated, then thrown away (surplus, stale, restarted without partial rollout)
    num_routing_decisions: int = 0
    num_loopbacks: int = 0
    num_sync_commands: int = 0
    num_migrations: int = 0
    num_ticks: int = 0
    num_requests: int = 0
    num_groups: int = 0
    trainer_busy_s: float = 0.0
    first_dispatch_s: float = 0.0
    last_progress_s: float = 0.0  # a trajectory finished or a step was trained
    end_s: float = 0.0


class StatsTap:
    """Counts what the simulated run's flows send and publish (``LocalBus(tap=...)``)."""

    def __init__(self, stats: SimStats, responses_per_prompt: int) -> None:
        self.stats = stats
        self.responses_per_prompt = responses_per_prompt

    def __call__(self, sender: str, effect: Effect, now: float) -> None:
        message, stats = effect.message if isinstance(effect, Send | Publish) else None, self.stats
        if isinstance(message, GenerateRequest):
            if sender == "coordinator":
                stats.num_requests += 1
                stats.num_groups += int(message.request_id % self.responses_per_prompt == 0)
            else:  # the router placed it
                stats.first_dispatch_s = stats.first_dispatch_s if stats.num_routing_decisions else now
                stats.num_routing_decisions += 1
        elif (
            isinstance(message, TrajectoryDone)
            and message.finish_reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TRUNCATED)
        ) or isinstance(message, TrainerProgress):
            stats.last_progress_s = now
        elif isinstance(message, SyncCommand):
            stats.num_sync_commands += 1
        elif isinstance(message, MigrateCommand):
            stats.num_migrations += 1
        elif isinstance(message, Metrics) and sender == "router":
            self._ledger_metrics(message)

    def _ledger_metrics(self, metrics: Metrics) -> None:
        """The router's figures of a consumed buffer: the ledger's own staleness count."""
        for name, value in metrics.values.items():
            if name.startswith("staleness/count_"):
                self.stats.ledger_staleness[int(name.removeprefix("staleness/count_"))] += int(value)
        self.stats.num_ledger_violations += int(metrics.values.get("staleness/bound_violations", 0))


@dataclass(frozen=True)
class SimSummary:
    """The figures of one run (the table row of a comparison)."""

    label: str
    num_instances: int
    num_steps: int
    sim_s: float
    trajectories_per_s: float
    tokens_per_s: float
    window_trajectories_per_s: float
    mean_train_s: float  # trainer seconds per step
    instance_busy: float  # fraction of instance time spent prefilling or decoding
    instance_syncing: float  # fraction of instance time spent pulling weights
    trainer_idle: float
    staleness: dict[int, int]
    num_trained: int
    num_mixed_versions: int
    num_bound_violations: int
    num_wasted_tokens: int
    num_generated_tokens: int
    num_prefill_tokens: int
    num_requests: int
    num_routing_decisions: int
    num_loopbacks: int
    num_syncs: int
    num_migrations: int
    num_preemptions: int
    wall_s: float

    @property
    def loopbacks_per_request(self) -> float:
        return self.num_loopbacks / self.num_requests if self.num_requests else 0.0

    @property
    def wasted_fraction(self) -> float:
        return self.num_wasted_tokens / self.num_generated_tokens if self.num_generated_tokens else 0.0


def steady_throughput(steps: list[TrainedStep], last_step: int) -> tuple[float, float]:
    """(trajectories/s, tokens/s) over steps 2..last_step; (0, 0) with fewer than two steps."""
    kept = sorted((s for s in steps if s.step <= last_step), key=lambda s: s.step)
    if len(kept) < 2:
        return 0.0, 0.0
    span = kept[-1].end_s - kept[0].end_s
    if span <= 0:
        return 0.0, 0.0
    return sum(s.num_trajectories for s in kept[1:]) / span, sum(s.num_tokens for s in kept[1:]) / span


def window_throughput(steps: list[TrainedStep], last_step: int, start_s: float) -> float:
    """Trajectories/s of steps 1..last_step over [start_s, end of last_step] (``psrl report``'s figure)."""
    kept = [s for s in steps if s.step <= last_step]
    if not kept:
        return 0.0
    span = max(s.end_s for s in kept) - start_s
    return sum(s.num_trajectories for s in kept) / span if span > 0 else 0.0


def staleness_text(histogram: dict[int, int]) -> str:
    """``0:40% 1:55% 2:5%``: the share of consumed trajectories at each staleness."""
    total = sum(histogram.values())
    if not total:
        return "-"
    return " ".join(f"{k}:{v / total:.0%}" for k, v in sorted(histogram.items()))
