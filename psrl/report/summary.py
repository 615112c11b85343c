"""The headline figures of a run, derived from its timeline.

Windows: *elapsed* spans the whole log (start-up and shutdown included); *work* runs from the
first request placed on an instance to the last finished training step, which is where the
throughput, busy and idle figures are measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from psrl.report.series import busy_fraction, metric_by_step, staleness_histogram, sync_phases, trainer_busy_by_step
from psrl.report.timeline import ProgressPoint, RunTimeline


@dataclass(frozen=True)
class RunSummary:
    num_steps: int
    elapsed_s: float
    work_s: float
    reward_first: float | None
    reward_last: float | None
    acc_first: float | None
    acc_last: float | None
    trajectories_per_s: float | None
    tokens_per_s: float | None
    busy_by_instance: dict[str, float] = field(default_factory=dict)
    trainer_idle_fraction: float | None = None
    staleness_mean: float | None = None
    num_syncs: int = 0
    num_migrations: int = 0
    push_ms_mean: float | None = None
    load_ms_mean: float | None = None
    pull_ms_mean: float | None = None  # the pull's share of load_ms_mean
    end_reason: str = ""
    num_steps_after_end: int = 0
    failures: dict[str, float] = field(default_factory=dict)  # failure counter -> total over the run
    first_reward_error: str = ""

    @property
    def busy_fraction(self) -> float | None:
        """Mean over instances of their busy fraction."""
        return statistics.fmean(self.busy_by_instance.values()) if self.busy_by_instance else None

    def _steps_text(self) -> str:
        if not self.num_steps_after_end:
            return str(self.num_steps)
        return f"{self.num_steps} (+{self.num_steps_after_end} finished while shutting down, not counted)"

    def rows(self) -> list[tuple[str, str]]:
        """(label, formatted value) lines for the HTML table and the console."""
        busy = ", ".join(f"{name} {_pct(value)}" for name, value in sorted(self.busy_by_instance.items()))
        return [
            ("training steps", self._steps_text()),
            ("elapsed (whole run)", f"{self.elapsed_s:.1f} s"),
            ("work window (first dispatch to last step)", f"{self.work_s:.1f} s"),
            ("reward: first step -> last step", f"{_num(self.reward_first)} -> {_num(self.reward_last)}"),
            ("accuracy: first step -> last step", f"{_num(self.acc_first)} -> {_num(self.acc_last)}"),
            ("trajectories/s trained", _num(self.trajectories_per_s, 2)),
            ("response tokens/s trained", _num(self.tokens_per_s, 1)),
            ("instance busy fraction (mean)", _pct(self.busy_fraction)),
            ("instance busy fraction (each)", busy or "-"),
            ("trainer idle fraction", _pct(self.trainer_idle_fraction)),
            ("mean staleness of trained trajectories", _num(self.staleness_mean, 2)),
            ("weight syncs commanded / migrations", f"{self.num_syncs} / {self.num_migrations}"),
            ("weight push, mean per version", _ms(self.push_ms_mean)),
            ("pull+load, mean per instance and version", _ms(self.load_ms_mean)),
            ("  of which pull (or waiting for the background pull)", _ms(self.pull_ms_mean)),
            *self._failure_rows(),
            ("end", self.end_reason or "-"),
        ]

    def _failure_rows(self) -> list[tuple[str, str]]:
        count = {name: int(self.failures.get(name, 0)) for name in FAILURE_COUNTERS}
        calls = count["reward/num_errors"] + count["reward/num_timeouts"] + count["reward/num_scored"]
        rows = [
            ("reward calls raised / timed out (of all calls)",
             f"{count['reward/num_errors']} / {count['reward/num_timeouts']} (of {calls})"),
            ("sessions / generations failed", f"{count['session/num_failed']} / {count['generation/num_failed']}"),
        ]  # fmt: skip
        return rows + ([("first failed reward call", self.first_reward_error)] if self.first_reward_error else [])


FAILURE_COUNTERS = (
    "reward/num_errors", "reward/num_timeouts", "reward/num_scored", "session/num_failed", "generation/num_failed",
)  # fmt: skip


def _failures(timeline: RunTimeline) -> tuple[dict[str, float], str]:
    """Every failure counter summed over the run's steps, and the first failed reward call's error."""
    totals = {name: sum(r.values.get(name, 0.0) for r in timeline.metrics) for name in FAILURE_COUNTERS}
    first = next((r.notes["reward/first_error"] for r in timeline.metrics if "reward/first_error" in r.notes), "")
    return totals, first


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def counted_progress(timeline: RunTimeline) -> list[ProgressPoint]:
    """Training steps finished before the run ended; steps the trainer finishes while shutting down
    (buffers dispatched ahead) are not part of the run's result."""
    if timeline.run_end is None:
        return list(timeline.progress)
    return [p for p in timeline.progress if p.time <= timeline.run_end.time]


def work_window(timeline: RunTimeline) -> tuple[float, float]:
    """(first request placed, last counted training step finished); falls back to the log's own span."""
    starts = [s.time for samples in timeline.status.values() for s in samples if s.num_running > 0]
    start = timeline.first_dispatch or (min(starts) if starts else timeline.start)
    progress = counted_progress(timeline)
    end = progress[-1].time if progress else timeline.end
    return start, max(end, start)


def summarize(timeline: RunTimeline) -> RunSummary:
    start, end = work_window(timeline)
    work_s = end - start
    last_step = max((p.step for p in counted_progress(timeline)), default=0)
    rewards = _values_up_to(timeline, "reward/mean", last_step)
    accs = _values_up_to(timeline, "acc/mean", last_step)
    trained = [b for b in timeline.batches if b.step <= last_step]
    phases = sync_phases(timeline.metrics, timeline.loaded)
    pushes = [p.push_ms for p in phases if p.push_ms > 0]
    loads = [point.load_ms for point in timeline.loaded]
    failures, first_reward_error = _failures(timeline)
    return RunSummary(
        num_steps=last_step,
        elapsed_s=timeline.elapsed_s,
        work_s=work_s,
        reward_first=rewards[0] if rewards else None,
        reward_last=rewards[-1] if rewards else None,
        acc_first=accs[0] if accs else None,
        acc_last=accs[-1] if accs else None,
        trajectories_per_s=_rate(sum(b.num_trajectories for b in trained), work_s, bool(trained)),
        tokens_per_s=_rate(sum(b.num_tokens for b in trained), work_s, bool(trained)),
        busy_by_instance=_busy_by_instance(timeline, start, end),
        trainer_idle_fraction=_trainer_idle(timeline, work_s, last_step),
        staleness_mean=_histogram_mean(staleness_histogram(timeline.metrics)),
        num_syncs=len(timeline.syncs),
        num_migrations=len(timeline.migrations),
        push_ms_mean=statistics.fmean(pushes) if pushes else None,
        load_ms_mean=statistics.fmean(loads) if loads else None,
        pull_ms_mean=statistics.fmean(point.pull_ms for point in timeline.loaded) if loads else None,
        end_reason=timeline.run_end.reason if timeline.run_end else "",
        num_steps_after_end=len({p.step for p in timeline.progress})
        - len({p.step for p in counted_progress(timeline)}),
        failures=failures,
        first_reward_error=first_reward_error,
    )


def _values_up_to(timeline: RunTimeline, name: str, last_step: int) -> list[float]:
    """Values of ``name`` by step, up to the last counted step (all of them when no step finished)."""
    return [value for step, value in metric_by_step(timeline.metrics, name) if not last_step or step <= last_step]


def _rate(amount: float, seconds: float, has_data: bool) -> float | None:
    return amount / seconds if has_data and seconds > 0 else None


def _busy_by_instance(timeline: RunTimeline, start: float, end: float) -> dict[str, float]:
    fractions = {name: busy_fraction(samples, start, end) for name, samples in timeline.status.items()}
    return {name: value for name, value in fractions.items() if value is not None}


def _trainer_idle(timeline: RunTimeline, work_s: float, last_step: int) -> float | None:
    busy = trainer_busy_by_step(timeline.metrics, timeline.progress)
    busy_s = sum(seconds for step, seconds in busy.items() if step <= last_step)
    if not busy or work_s <= 0:
        return None
    return min(max(1.0 - busy_s / work_s, 0.0), 1.0)


def _histogram_mean(counts: dict[int, float]) -> float | None:
    total = sum(counts.values())
    return sum(k * n for k, n in counts.items()) / total if total > 0 else None
