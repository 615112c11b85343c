"""Build a `RunTimeline` from a run directory's event log (and metrics.jsonl when the log has no metrics)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bus.eventlog.reader import EventLogReader
from bus.messages import (
    InstanceStatus,
    MemorySwitched,
    Metrics,
    MigrateCommand,
    RoutingRecord,
    RunFinished,
    StalenessCertificate,
    SyncCommand,
    TrainBatch,
    TrainerProgress,
    WeightsLoaded,
    WeightsPublished,
)
from bus.schema import Event, Message
from psrl.report.metrics_file import MetricsRecord, read_metrics_file
from psrl.report.timeline import (
    BatchPoint,
    CertificatePoint,
    LoadedPoint,
    MigrateMark,
    ProgressPoint,
    RunEnd,
    RunTimeline,
    StatusSample,
    SwitchMark,
    SyncMark,
)

# The router's first routing decision marks the moment rollout work starts (requests logged before it
# only wait in the router's queue).
_DISPATCH_KINDS = (RoutingRecord,)


class PlotTimelineBuilder:
    """Feed events in any order with `observe`; `finish` sorts and returns the timeline."""

    def __init__(self) -> None:
        self.timeline = RunTimeline()
        self._handlers: dict[type[Message], Callable[[Any, float], None]] = {
            InstanceStatus: self._on_status,
            TrainerProgress: self._on_progress,
            TrainBatch: self._on_batch,
            WeightsPublished: self._on_published,
            WeightsLoaded: self._on_loaded,
            SyncCommand: self._on_sync,
            MigrateCommand: self._on_migrate,
            RunFinished: self._on_finished,
            MemorySwitched: self._on_switched,
            StalenessCertificate: self._on_certificate,
        }

    def observe(self, event: Event[Any]) -> None:
        line = self.timeline
        time = event.envelope.wall_ns / 1e9
        line.num_events += 1
        line.start = min(line.start, time)
        line.end = max(line.end, time)
        msg = event.message
        if isinstance(msg, Metrics):
            line.metrics.append(MetricsRecord.from_event(event))
        elif isinstance(msg, _DISPATCH_KINDS):
            if line.first_dispatch is None or time < line.first_dispatch:
                line.first_dispatch = time
        else:
            handler = self._handlers.get(type(msg))
            if handler is not None:
                handler(msg, time)

    def _on_status(self, msg: InstanceStatus, time: float) -> None:
        kv_usage = msg.kv_blocks_used / msg.kv_blocks_total if msg.kv_blocks_total else 0.0
        sample = StatusSample(time, msg.num_running, msg.num_waiting, msg.weight_version, msg.tokens_per_s, kv_usage)
        self.timeline.status.setdefault(msg.instance, []).append(sample)

    def _on_progress(self, msg: TrainerProgress, time: float) -> None:
        self.timeline.progress.append(ProgressPoint(time, msg.step, msg.version, msg.num_samples, msg.step_s))

    def _on_batch(self, msg: TrainBatch, time: float) -> None:
        self.timeline.batches.append(BatchPoint(time, msg.step, msg.num_trajectories, msg.num_tokens))

    def _on_published(self, msg: WeightsPublished, time: float) -> None:
        self.timeline.published.append((time, msg.version))

    def _on_loaded(self, msg: WeightsLoaded, time: float) -> None:
        self.timeline.loaded.append(LoadedPoint(time, msg.instance, msg.version, msg.load_ms, msg.pull_ms))

    def _on_sync(self, msg: SyncCommand, time: float) -> None:
        mark = SyncMark(time, msg.version, tuple(msg.instances), msg.strategy, msg.abort_running)
        self.timeline.syncs.append(mark)

    def _on_migrate(self, msg: MigrateCommand, time: float) -> None:
        num_requests = len(msg.request_ids) or msg.num_requests
        self.timeline.migrations.append(MigrateMark(time, msg.source, msg.target, num_requests))

    def _on_switched(self, msg: MemorySwitched, time: float) -> None:
        mark = SwitchMark(time, msg.actor, msg.side, msg.action, msg.duration_ms, msg.changed_bytes)
        self.timeline.switches.append(mark)

    def _on_certificate(self, msg: StalenessCertificate, time: float) -> None:
        point = CertificatePoint(
            version=msg.version,
            staleness=tuple(int(msg.buffer - v) for v in msg.v_traj),
            is_mean=tuple(float(x) for x in msg.is_mean),
            is_clipped_frac=tuple(float(x) for x in msg.is_clipped_frac),
            num_interrupted=int(((msg.flags >= 0) & ((msg.flags & 1) == 1)).sum()),
            masked_frac=() if msg.masked_frac is None else tuple(float(x) for x in msg.masked_frac),
            correction=msg.correction,
        )
        self.timeline.certificates.append(point)

    def _on_finished(self, msg: RunFinished, time: float) -> None:
        self.timeline.run_end = RunEnd(time, msg.success, msg.reason)

    def finish(self, problems: Iterable[str] = ()) -> RunTimeline:
        self.timeline.problems.extend(problems)
        return self.timeline.finish()


def read_timeline(run_dir: str | Path) -> RunTimeline:
    """The timeline of ``run_dir``; unreadable parts of the log are listed in `RunTimeline.problems`."""
    run = Path(run_dir)
    reader = EventLogReader(run / "events")
    builder = PlotTimelineBuilder()
    for logged in reader.events():
        builder.observe(logged.event)
    problems = [f"event log: {p.describe()}" for p in reader.problems]
    timeline = builder.finish(problems)
    metrics_path = run / "metrics.jsonl"
    if not timeline.metrics and metrics_path.is_file():
        records, bad_lines = read_metrics_file(metrics_path)
        timeline.metrics.extend(sorted(records, key=lambda r: r.wall_time))
        timeline.problems.extend(bad_lines)
    return timeline
