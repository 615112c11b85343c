"""Replaying a recorded run: one pass over the log feeds the timeline and every checker."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bus.eventlog import EventLogReader
from bus.plain import to_builtins
from bus.schema import Event
from psrl.config import Config, load_config
from psrl.replay.checker import CANNOT_JUDGE, Checker, NotJudged, available_checkers
from psrl.replay.timeline import TimelineBuilder, TimelineSummary

MAX_LISTED = 20  # disagreements kept per checker; the counts cover all of them


class ReplayError(ValueError):
    """The replay cannot run as asked (unknown checker, no log)."""


@dataclass(frozen=True)
class Disagreement:
    event_id: str
    kind: str
    recorded: Any
    recomputed: Any


@dataclass
class Verdicts:
    """How one checker's decisions compare with the recorded ones."""

    num_decisions: int = 0
    num_agree: int = 0
    num_skipped: int = 0
    not_judged: dict[str, int] = field(default_factory=dict)  # reason -> decisions not judged for it
    disagreements: list[Disagreement] = field(default_factory=list)

    @property
    def num_disagree(self) -> int:
        return self.num_decisions - self.num_agree - self.num_skipped

    def add(self, event: Event[Any], recorded: Any, recomputed: Any, is_same: bool) -> None:
        self.num_decisions += 1
        if recomputed is None or isinstance(recomputed, NotJudged):
            self.num_skipped += 1
            reason = CANNOT_JUDGE if recomputed is None else recomputed.reason
            self.not_judged[reason] = self.not_judged.get(reason, 0) + 1
        elif is_same:
            self.num_agree += 1
        elif len(self.disagreements) < MAX_LISTED:
            env = event.envelope
            self.disagreements.append(
                Disagreement(env.event_id, env.kind, to_builtins(recorded), to_builtins(recomputed))
            )


@dataclass
class CheckerReport:
    name: str
    agreement: Verdicts
    what_if: Verdicts | None = None


class _CheckerRun:
    def __init__(self, checker: Checker, verdicts: Verdicts) -> None:
        self.checker = checker
        self.verdicts = verdicts

    def step(self, event: Event[Any]) -> None:
        checker = self.checker
        if checker.is_decision(event.kind):
            recorded = checker.recorded(event)
            recomputed = checker.redecide(event)
            judged = recomputed is not None and not isinstance(recomputed, NotJudged)
            is_same = judged and checker.agrees(recorded, recomputed)
            self.verdicts.add(event, recorded, recomputed, is_same)
        if checker.is_input(event.kind):
            checker.observe(event)


def run_checkers(
    events: Iterable[Event[Any]],
    checkers: Sequence[type[Checker]],
    config: Config,
    what_if: Config | None = None,
) -> list[CheckerReport]:
    """Replay `events` through each checker (and its what-if twin); one report per checker."""
    reports = [CheckerReport(cls.name, Verdicts(), Verdicts() if what_if is not None else None) for cls in checkers]
    runs = [_CheckerRun(cls(config), report.agreement) for cls, report in zip(checkers, reports, strict=True)]
    if what_if is not None:
        runs += [_CheckerRun(cls(what_if), r.what_if) for cls, r in zip(checkers, reports, strict=True) if r.what_if]
    for event in events:
        for run in runs:
            run.step(event)
    return reports


@dataclass
class ReplayReport:
    run_dir: str
    config_source: str
    what_if_overrides: list[str]
    timeline: TimelineSummary
    checkers: list[CheckerReport]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "config_source": self.config_source,
            "what_if_overrides": self.what_if_overrides,
            "timeline": self.timeline.to_json(),
            "checkers": [_checker_json(c) for c in self.checkers],
        }


def _checker_json(report: CheckerReport) -> dict[str, Any]:
    def verdicts(v: Verdicts) -> dict[str, Any]:
        return {**asdict(v), "num_disagree": v.num_disagree}

    data: dict[str, Any] = {"name": report.name, "agreement": verdicts(report.agreement)}
    if report.what_if is not None:
        data["what_if"] = verdicts(report.what_if)
    return data


def resolve_checkers(names: Sequence[str]) -> list[type[Checker]]:
    known = available_checkers()
    if list(names) == ["all"]:
        return list(known.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ReplayError(f"unknown checker(s) {unknown}; available: {', '.join(known) or 'none'}")
    return [known[n] for n in names]


def replay_run(run_dir: str | Path, checker_names: Sequence[str] = (), what_if: Sequence[str] = ()) -> ReplayReport:
    """Read ``run_dir/events`` once: timeline summary plus the named checkers (``["all"]`` = all)."""
    run = Path(run_dir)
    events_dir = run / "events"
    if not events_dir.is_dir():
        raise ReplayError(f"{events_dir} does not exist: is {run} a run directory?")
    checkers = resolve_checkers(checker_names)
    config_path = run / "config.yaml"
    preset = str(config_path) if config_path.is_file() else None
    config = load_config(preset)
    what_if_config = load_config(preset, list(what_if)) if what_if else None
    reader = EventLogReader(events_dir)
    timeline = TimelineBuilder()

    def logged_events() -> Iterable[Event[Any]]:
        for logged in reader.events():
            timeline.observe(logged.event)
            yield logged.event

    reports = run_checkers(logged_events(), checkers, config, what_if_config)
    return ReplayReport(
        run_dir=str(run),
        config_source=preset or "defaults (no config.yaml in the run directory)",
        what_if_overrides=list(what_if),
        timeline=timeline.finish(reader.problems),
        checkers=reports,
    )
