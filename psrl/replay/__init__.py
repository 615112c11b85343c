"""Replay of recorded runs: the timeline summary and the decision-checker registry."""

from psrl.replay.checker import CHECKER_MODULES, Checker, available_checkers, register_checker
from psrl.replay.runner import (
    CheckerReport,
    Disagreement,
    ReplayError,
    ReplayReport,
    Verdicts,
    replay_run,
    run_checkers,
)
from psrl.replay.timeline import TimelineBuilder, TimelineSummary

__all__ = [
    "CHECKER_MODULES",
    "Checker",
    "CheckerReport",
    "Disagreement",
    "ReplayError",
    "ReplayReport",
    "TimelineBuilder",
    "TimelineSummary",
    "Verdicts",
    "available_checkers",
    "register_checker",
    "replay_run",
    "run_checkers",
]
