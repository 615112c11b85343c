"""Readable text of a replay report (``psrl replay``; ``--json`` prints `ReplayReport.to_json`)."""

from __future__ import annotations

import datetime as dt
import json

from bus.plain import readable
from psrl.replay.runner import CheckerReport, ReplayReport, Verdicts

_MAX_ROWS = 15


def _when(wall_ns: int | None) -> str:
    if wall_ns is None:
        return "-"
    return dt.datetime.fromtimestamp(wall_ns / 1e9, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def render_report(report: ReplayReport) -> str:
    t = report.timeline
    lines = [
        f"run      {report.run_dir}",
        f"config   {report.config_source}",
        f"events   {t.num_events} over {t.span_s:.3f} s ({_when(t.first_wall_ns)} .. {_when(t.last_wall_ns)})",
        "",
        "events per kind",
    ]
    lines += [f"  {kind:<26} {n:>10}" for kind, n in list(t.events_per_kind.items())[:_MAX_ROWS]]
    if len(t.events_per_kind) > _MAX_ROWS:
        lines.append(f"  ... {len(t.events_per_kind) - _MAX_ROWS} more kinds")
    lines += ["", "events per actor (missing = sequence numbers never logged)"]
    for name, actor in list(t.actors.items())[: _MAX_ROWS * 2]:
        late = f", {actor.num_late} late" if actor.num_late else ""
        lines.append(
            f"  {name:<26} {actor.num_events:>10}   last seq {actor.last_seq}, missing {actor.num_missing}{late}"
        )
    lines += ["", "quiet gaps (>= 1 s without events)"]
    lines += [f"  {g.seconds:9.3f} s after {g.after_event_id} at {_when(g.start_wall_ns)}" for g in t.quiet_gaps] or [
        "  none"
    ]
    lines += ["", "log problems (corrupt or torn records; everything before each was read)"]
    lines += [f"  {p.describe()}" for p in t.problems] or ["  none"]
    for checker in report.checkers:
        lines += ["", *_checker_lines(checker, report.what_if_overrides)]
    return "\n".join(lines)


def _checker_lines(report: CheckerReport, overrides: list[str]) -> list[str]:
    lines = [f"checker {report.name}: {_verdict_text(report.agreement, 'agree with the record')}"]
    lines += _disagreement_lines(report.agreement)
    if report.what_if is not None:
        changed = report.what_if.num_disagree
        lines.append(
            f"  what-if {' '.join(overrides)}: {changed} of {report.what_if.num_decisions} decisions would change"
        )
        lines += _disagreement_lines(report.what_if)
    return lines


def _verdict_text(v: Verdicts, label: str) -> str:
    reasons = "; ".join(f"{n} {reason}" for reason, n in sorted(v.not_judged.items(), key=lambda kv: -kv[1]))
    skipped = f", {v.num_skipped} not judged ({reasons})" if v.num_skipped else ""
    return f"{v.num_agree} of {v.num_decisions} decisions {label}{skipped}"


def _disagreement_lines(v: Verdicts) -> list[str]:
    lines = [
        f"    {d.event_id} {d.kind}: recorded {_clip(d.recorded)} / recomputed {_clip(d.recomputed)}"
        for d in v.disagreements
    ]
    if v.num_disagree > len(v.disagreements):
        lines.append(f"    ... {v.num_disagree - len(v.disagreements)} more")
    return lines


def _clip(value: object) -> str:
    text = json.dumps(readable(value), default=str)
    return text if len(text) <= 120 else text[:119] + "…"
