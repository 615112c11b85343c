"""What a report needs from a run, gathered in one pass over its event log.

Times are wall-clock seconds since the epoch (from each event's envelope): the actors of one run
may live on several hosts, and their monotonic clocks are not comparable while wall clocks are
(NTP-synchronised). `RunTimeline.relative` turns them into seconds since the run started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psrl.report.metrics_file import MetricsRecord


@dataclass(frozen=True)
class StatusSample:
    time: float
    num_running: int
    num_waiting: int
    weight_version: int
    tokens_per_s: float
    kv_usage: float


@dataclass(frozen=True)
class ProgressPoint:
    time: float
    step: int
    version: int
    num_samples: int
    step_s: float


@dataclass(frozen=True)
class BatchPoint:
    time: float
    step: int
    num_trajectories: int
    num_tokens: int


@dataclass(frozen=True)
class LoadedPoint:
    time: float
    instance: str
    version: int
    load_ms: float
    pull_ms: float = 0.0  # the part of load_ms spent getting the bytes


@dataclass(frozen=True)
class SyncMark:
    time: float
    version: int
    instances: tuple[str, ...]
    strategy: str
    is_abort: bool


@dataclass(frozen=True)
class MigrateMark:
    time: float
    source: str
    target: str
    num_requests: int


@dataclass(frozen=True)
class SwitchMark:
    """An actor paused or resumed its GPU memory (``tms.switched``); ``time`` is when it reported, done."""

    time: float
    actor: str
    side: str
    action: str
    duration_ms: float
    changed_bytes: int


@dataclass(frozen=True)
class CertificatePoint:
    """One step's staleness certificate: per trajectory, its staleness and importance-weight statistics."""

    version: int
    staleness: tuple[int, ...]  # buffer - V_traj
    is_mean: tuple[float, ...]  # nan = not measured
    is_clipped_frac: tuple[float, ...]
    num_interrupted: int
    masked_frac: tuple[float, ...] = ()  # share of each trajectory's tokens the correction rejected; nan = none
    correction: str = ""  # the rollout correction applied (empty: not recorded)


@dataclass(frozen=True)
class RunEnd:
    time: float
    success: bool
    reason: str


@dataclass
class RunTimeline:
    """Everything the plots and the summary use; lists are sorted by time once `finish` ran."""

    start: float = float("inf")
    end: float = float("-inf")
    first_dispatch: float | None = None
    num_events: int = 0
    metrics: list[MetricsRecord] = field(default_factory=list)
    status: dict[str, list[StatusSample]] = field(default_factory=dict)
    progress: list[ProgressPoint] = field(default_factory=list)
    batches: list[BatchPoint] = field(default_factory=list)
    published: list[tuple[float, int]] = field(default_factory=list)
    loaded: list[LoadedPoint] = field(default_factory=list)
    syncs: list[SyncMark] = field(default_factory=list)
    migrations: list[MigrateMark] = field(default_factory=list)
    switches: list[SwitchMark] = field(default_factory=list)
    certificates: list[CertificatePoint] = field(default_factory=list)
    run_end: RunEnd | None = None
    problems: list[str] = field(default_factory=list)

    def relative(self, time: float) -> float:
        """Seconds since the run started."""
        return time - self.start

    @property
    def elapsed_s(self) -> float:
        return max(self.end - self.start, 0.0) if self.num_events else 0.0

    @property
    def instances(self) -> list[str]:
        return sorted(self.status)

    def finish(self) -> RunTimeline:
        for series in (
            self.metrics,
            self.progress,
            self.batches,
            self.loaded,
            self.syncs,
            self.migrations,
            self.switches,
        ):
            series.sort(key=_by_time)
        self.published.sort()
        self.certificates.sort(key=lambda c: c.version)
        for samples in self.status.values():
            samples.sort(key=_by_time)
        return self


def _by_time(item: Any) -> float:
    return float(getattr(item, "time", getattr(item, "wall_time", 0.0)))
