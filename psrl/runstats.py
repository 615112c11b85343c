"""Throughput and utilisation of a run, computed from its event log.

The steady-state window runs from the first to the last `train.progress` event: start-up
(model loading, the first buffer) is excluded, so two runs of different lengths compare fairly.

* consumed throughput: trajectories and response tokens of the buffers trained in the window
  (`train.batch` events of steps 2..N, i.e. what the trainer consumed after the first step);
* rollout busy fraction: per instance, the share of the window with at least one running
  request, from `inst.status` snapshots (each snapshot holds until the next one);
* trainer idle fraction: the share of the window the trainer spent not training
  (window minus the `step_s` of the steps finished in it);
* weight sync: `wt.loaded` pull+load times and the trainer's `sync/push_s`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from bus.messages import InstanceStatus, Metrics, TrainBatch, TrainerProgress, WeightsLoaded


@dataclass
class RunStats:
    num_steps: int = 0
    window_s: float = 0.0
    trajectories_per_s: float = 0.0
    tokens_per_s: float = 0.0
    rollout_busy: float = 0.0
    busy_by_instance: dict[str, float] = field(default_factory=dict)
    trainer_idle: float = 0.0
    pull_load_ms: float = 0.0
    push_s: float = 0.0
    first_reward: float | None = None
    last_reward: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def run_stats(events: Iterable[Any]) -> RunStats:
    progress: list[tuple[float, TrainerProgress]] = []
    batches: dict[int, TrainBatch] = {}
    statuses: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    loads: list[float] = []
    pushes: list[float] = []
    rewards: dict[int, float] = {}
    for event in events:
        msg, when = event.message, event.envelope.wall_ns / 1e9
        if isinstance(msg, TrainerProgress):
            progress.append((when, msg))
        elif isinstance(msg, TrainBatch):
            batches[msg.step] = msg
        elif isinstance(msg, InstanceStatus):
            statuses[msg.instance].append((when, msg.num_running > 0))
        elif isinstance(msg, WeightsLoaded):
            loads.append(msg.load_ms)
        elif isinstance(msg, Metrics):
            if "sync/push_s" in msg.values:
                pushes.append(msg.values["sync/push_s"])
            if event.envelope.sender == "coordinator" and "reward/mean" in msg.values:
                rewards[msg.step] = msg.values["reward/mean"]
    return _summarise(progress, batches, statuses, loads, pushes, rewards)


def _summarise(
    progress: list[tuple[float, TrainerProgress]],
    batches: dict[int, TrainBatch],
    statuses: dict[str, list[tuple[float, bool]]],
    loads: list[float],
    pushes: list[float],
    rewards: dict[int, float],
) -> RunStats:
    stats = RunStats(num_steps=len(progress))
    trained = sorted(rewards)
    if trained:
        last_step = max(p.step for _, p in progress) if progress else trained[-1]
        stats.first_reward = rewards[trained[0]]
        stats.last_reward = rewards.get(last_step, rewards[trained[-1]])
    stats.pull_load_ms = mean(loads) if loads else 0.0
    stats.push_s = mean(pushes) if pushes else 0.0
    if len(progress) < 2:
        return stats
    start, end = progress[0][0], progress[-1][0]
    window = max(end - start, 1e-9)
    stats.window_s = window
    steps_in_window = [p for _, p in progress[1:]]
    done = [batches[p.step] for p in steps_in_window if p.step in batches]
    stats.trajectories_per_s = sum(b.num_trajectories for b in done) / window
    stats.tokens_per_s = sum(b.num_tokens for b in done) / window
    stats.trainer_idle = max(0.0, 1.0 - sum(p.step_s for p in steps_in_window) / window)
    stats.busy_by_instance = {name: _busy_share(series, start, end) for name, series in sorted(statuses.items())}
    stats.rollout_busy = mean(stats.busy_by_instance.values()) if stats.busy_by_instance else 0.0
    return stats


def _busy_share(series: list[tuple[float, bool]], start: float, end: float) -> float:
    """Share of [start, end] with a running request, each snapshot holding until the next."""
    busy = 0.0
    for (when, is_busy), (next_when, _) in zip(series, [*series[1:], (end, False)], strict=True):
        lo, hi = max(when, start), min(next_when, end)
        if is_busy and hi > lo:
            busy += hi - lo
    return busy / max(end - start, 1e-9)
