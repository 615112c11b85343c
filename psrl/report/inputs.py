"""What every plot function receives, and how it says it has nothing to draw."""

from __future__ import annotations

from dataclasses import dataclass

from psrl.report.summary import RunSummary
from psrl.report.timeline import RunTimeline


class NoDataError(Exception):
    """The run's log holds nothing this plot is drawn from (the reason says what is missing)."""


@dataclass(frozen=True)
class ReportInputs:
    run_name: str
    timeline: RunTimeline
    summary: RunSummary
    staleness_bound: int | None
