"""When failing reward calls end a run: a fraction of a step's calls, over several steps in a row.

A reward call that fails scores `reward.error_score`, so a run whose reward function always raises
would train on a constant reward and finish "successfully". The coordinator feeds each step's
counts to a `FailureWatch`; one step over the fraction is a warning (a flaky judge), but
`reward.error_patience` such steps in a row stop the run: the reward is broken, not flaky.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class StepFailures:
    """One step's reward calls: how many were made and how many failed (errors and timeouts)."""

    num_errors: int
    num_timeouts: int
    num_calls: int

    @property
    def num_failed(self) -> int:
        return self.num_errors + self.num_timeouts

    @property
    def fraction(self) -> float:
        return self.num_failed / self.num_calls if self.num_calls else 0.0


def step_failures(values: Mapping[str, float]) -> StepFailures:
    """The counts in a step's metrics (the scorer's reward/num_scored, num_errors, num_timeouts)."""
    errors = int(values.get("reward/num_errors", 0))
    timeouts = int(values.get("reward/num_timeouts", 0))
    return StepFailures(errors, timeouts, errors + timeouts + int(values.get("reward/num_scored", 0)))


@dataclass
class FailureWatch:
    """Counts the consecutive steps whose failed fraction is over ``max_fraction``."""

    max_fraction: float
    patience: int
    streak: int = 0

    def observe(self, step: StepFailures) -> bool:
        """Take one step's counts; True when the run should stop. A step without reward calls (every
        trajectory scored by its environment) neither extends nor breaks the streak."""
        if step.num_calls == 0:
            return False
        # a fraction of 1 never stops: every call failing is not "more than" all of them
        self.streak = self.streak + 1 if step.fraction > self.max_fraction else 0
        return self.streak >= self.patience


def stop_reason(watch: FailureWatch, step: StepFailures, first_error: str) -> str:
    """The one line a stopped run ends with: what happened, the first error, and what to do."""
    return (
        f"reward calls failed on {watch.streak} steps in a row (last step: {step.num_failed} of {step.num_calls}, "
        f"over reward.max_error_fraction={watch.max_fraction:g}); first error: {first_error or 'not recorded'}. "
        "Fix the reward function (see logs/coordinator.log) and launch the same run again: it continues "
        "from its latest checkpoint; or raise reward.error_patience / reward.max_error_fraction"
    )
