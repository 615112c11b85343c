"""Pure functions from a `RunTimeline` to the series the plots draw and the summary uses."""

from __future__ import annotations

import bisect
import itertools
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from psrl.report.metrics_file import MetricsRecord
from psrl.report.timeline import LoadedPoint, ProgressPoint, StatusSample

PREFERRED_SENDER = "coordinator"
_ROUTER_COUNT = re.compile(r"^staleness/count_(\d+)$")
_TRAINER_HIST = re.compile(r"^staleness/hist/(\d+)$")


def is_trainer(sender: str) -> bool:
    return sender.startswith("trainer")


def metric_source(records: Sequence[MetricsRecord], name: str) -> str | None:
    """Whose values of ``name`` to plot: the coordinator's, else the first trainer rank's, else anyone's."""
    senders = sorted({r.sender for r in records if name in r.values})
    if PREFERRED_SENDER in senders:
        return PREFERRED_SENDER
    trainers = [s for s in senders if is_trainer(s)]
    choices = trainers or senders
    return choices[0] if choices else None


def metric_by_step(records: Sequence[MetricsRecord], name: str) -> list[tuple[int, float]]:
    """(step, value) of ``name`` from one sender (see `metric_source`); repeats of a step are averaged."""
    source = metric_source(records, name)
    by_step: dict[int, list[float]] = defaultdict(list)
    for record in records:
        if record.sender == source and name in record.values:
            by_step[record.step].append(record.values[name])
    return [(step, statistics.fmean(values)) for step, values in sorted(by_step.items())]


def staleness_histogram(records: Sequence[MetricsRecord]) -> dict[int, float]:
    """Trajectories consumed per staleness (versions behind the trainer), summed over the run.

    The router's ``staleness/count_<k>`` per consumed buffer is the source; without it, one trainer
    rank's ``staleness/hist/<k>`` (every rank sees the whole buffer, so ranks are not added up).
    """
    counts = _sum_matching(r for r in records if r.sender == "router")
    if counts:
        return counts
    trainers = sorted({r.sender for r in records if is_trainer(r.sender)})
    return _sum_matching((r for r in records if trainers and r.sender == trainers[0]), _TRAINER_HIST)


def _sum_matching(records: Iterable[MetricsRecord], pattern: re.Pattern[str] = _ROUTER_COUNT) -> dict[int, float]:
    counts: dict[int, float] = defaultdict(float)
    for record in records:
        for name, value in record.values.items():
            match = pattern.match(name)
            if match and math.isfinite(value):
                counts[int(match.group(1))] += value
    return dict(sorted(counts.items()))


# ---------------------------------------------------------------------------- instance utilisation

_MAX_HOLD_INTERVALS = 5


def status_segments(samples: Sequence[StatusSample], end: float) -> list[tuple[float, float, StatusSample]]:
    """(from, to, sample): each status report holds until the next one.

    A report holds for at most `_MAX_HOLD_INTERVALS` typical intervals, so an instance that went
    silent (killed, restarting) is not counted as busy; the last one holds one interval, up to ``end``.
    """
    if not samples:
        return []
    gaps = [b.time - a.time for a, b in itertools.pairwise(samples) if b.time > a.time]
    interval = statistics.median(gaps) if gaps else 0.0
    segments = []
    for index, sample in enumerate(samples):
        following = samples[index + 1].time if index + 1 < len(samples) else min(end, sample.time + interval)
        until = min(following, sample.time + _MAX_HOLD_INTERVALS * interval)
        if until > sample.time:
            segments.append((sample.time, until, sample))
    return segments


def busy_seconds(samples: Sequence[StatusSample], start: float, end: float) -> float:
    """Seconds within [start, end) during which the instance reported running requests."""
    total = 0.0
    for begin, until, sample in status_segments(samples, end):
        if sample.num_running > 0:
            total += max(0.0, min(until, end) - max(begin, start))
    return total


def busy_fraction(samples: Sequence[StatusSample], start: float, end: float) -> float | None:
    """Share of [start, end) with running requests; silence counts as not busy. None for an empty window."""
    if end <= start or not samples:
        return None
    return busy_seconds(samples, start, end) / (end - start)


def binned_mean(
    samples: Sequence[StatusSample], start: float, end: float, bin_s: float, value: Callable[[StatusSample], float]
) -> list[tuple[float, float]]:
    """(bin start, time-weighted mean of ``value``) over bins of ``bin_s`` seconds covering [start, end).

    Time an instance did not report (see `status_segments`) counts as zero.
    """
    if bin_s <= 0:
        raise ValueError(f"bin_s must be positive, got {bin_s}")
    edges = [start + i * bin_s for i in range(max(math.ceil((end - start) / bin_s), 0))]
    totals = [0.0] * len(edges)
    for begin, until, sample in status_segments(samples, end):
        amount = value(sample)
        first = max(int((begin - start) // bin_s), 0)
        for index in range(first, len(edges)):
            lower = edges[index]
            if lower >= until:
                break
            totals[index] += amount * max(0.0, min(until, lower + bin_s, end) - max(begin, lower))
    return [(lower, total / (min(lower + bin_s, end) - lower)) for lower, total in zip(edges, totals, strict=True)]


def busy_series(samples: Sequence[StatusSample], start: float, end: float, bin_s: float) -> list[tuple[float, float]]:
    """(bin start, busy fraction) over consecutive bins of ``bin_s`` seconds covering [start, end)."""
    return binned_mean(samples, start, end, bin_s, lambda s: float(s.num_running > 0))


def nice_bin_seconds(span_s: float, num_bins: int = 80) -> float:
    """The smallest round bin width that cuts ``span_s`` into at most about ``num_bins`` bins."""
    for width in (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0):
        if span_s / width <= num_bins:
            return width
    return 3600.0


# ---------------------------------------------------------------------------- versions


def version_at(changes: Sequence[tuple[float, int]], time: float) -> int | None:
    """The version in force at ``time`` from sorted (time, version) changes; None before the first."""
    index = bisect.bisect_right(changes, (time, math.inf)) - 1
    return changes[index][1] if index >= 0 else None


def ps_versions(published: Sequence[tuple[float, int]], start: float, initial: int | None) -> list[tuple[float, int]]:
    """The parameter server's latest version over time, as sorted (time, version) changes.

    Before its first publication in the log the server holds ``initial`` (the version the instances
    start with), when known.
    """
    changes = [(start, initial)] if initial is not None else []
    latest = initial if initial is not None else -1
    for time, version in sorted(published):
        if version > latest:
            changes.append((time, version))
            latest = version
    return changes


def version_lag(samples: Sequence[StatusSample], ps_changes: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """(time, PS version minus the instance's loaded version) at each of the instance's reports."""
    lags = []
    for sample in samples:
        latest = version_at(ps_changes, sample.time)
        if latest is not None:
            lags.append((sample.time, max(latest - sample.weight_version, 0)))
    return lags


# ---------------------------------------------------------------------------- weight sync and training time


@dataclass(frozen=True)
class SyncPhases:
    """Weight-sync time of one version in milliseconds: push phases (trainer) and pull+load (instances)."""

    version: int
    serialize_ms: float
    transfer_ms: float
    commit_ms: float
    other_push_ms: float
    load_ms_max: float
    load_ms_mean: float
    num_loads: int

    @property
    def push_ms(self) -> float:
        return self.serialize_ms + self.transfer_ms + self.commit_ms + self.other_push_ms


_PUSH_PHASES = ("sync/serialize_s", "sync/transfer_s", "sync/commit_s")


def sync_phases(records: Sequence[MetricsRecord], loaded: Sequence[LoadedPoint]) -> list[SyncPhases]:
    """Per version: the slowest trainer rank's push phases and the instances' pull+load times."""
    push: dict[int, dict[str, float]] = defaultdict(dict)
    for record in records:
        if is_trainer(record.sender) and "sync/push_s" in record.values:
            version = record.model_version if record.model_version is not None else record.step
            phases = push[version]
            for name in ("sync/push_s", *_PUSH_PHASES):
                phases[name] = max(phases.get(name, 0.0), record.values.get(name, 0.0))
    loads: dict[int, list[float]] = defaultdict(list)
    for point in loaded:
        loads[point.version].append(point.load_ms)
    return [_phases_of(version, push.get(version, {}), loads.get(version, [])) for version in sorted({*push, *loads})]


def _phases_of(version: int, push: dict[str, float], loads: list[float]) -> SyncPhases:
    serialize, transfer, commit = (push.get(name, 0.0) * 1e3 for name in _PUSH_PHASES)
    other = max(push.get("sync/push_s", 0.0) * 1e3 - serialize - transfer - commit, 0.0)
    return SyncPhases(
        version, serialize, transfer, commit, other,
        max(loads, default=0.0), statistics.fmean(loads) if loads else 0.0, len(loads),
    )  # fmt: skip


def trainer_busy_by_step(records: Sequence[MetricsRecord], progress: Sequence[ProgressPoint]) -> dict[int, float]:
    """Seconds the trainer worked on each step: compute (perf/train_seconds) plus weight push
    (sync/push_s), the slowest rank; without those metrics, the step time the trainer reported. A push
    made in the background (its record carries sync/push_wait_s) held the trainer only while it waited
    for it, so that wait counts instead of the push."""
    per_rank: dict[tuple[str, int], float] = defaultdict(float)
    for record in records:
        if is_trainer(record.sender):
            push = "sync/push_wait_s" if "sync/push_wait_s" in record.values else "sync/push_s"
            for name in ("perf/train_seconds", push):
                if math.isfinite(value := record.values.get(name, math.nan)):
                    per_rank[record.sender, record.step] += value
    busy: dict[int, float] = {}
    for (_, step), seconds in per_rank.items():
        busy[step] = max(busy.get(step, 0.0), seconds)
    if not busy:
        for point in progress:
            busy[point.step] = max(busy.get(point.step, 0.0), point.step_s)
    return dict(sorted(busy.items()))
