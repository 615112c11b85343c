"""Console progress of a run: one line per training step, from the run's own events."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bus.messages import InstanceStatus, Metrics, RunFinished, ScaleDecided, TrainerProgress
from bus.schema import Event
from psrl.config import Config
from psrl.report.busy import BusyClock
from psrl.rewards.failures import step_failures

SUMMARY_WINDOW = 5
BUSY_LEGEND = (
    "(busy: the share of each step's time an instance was generating; the rest it was syncing weights "
    "or had nothing to run, which is rollout waiting for the trainer when buffers are full up to psrl.staleness)"
)


class ProgressView:
    """Turns TrainerProgress / Metrics / InstanceStatus events into progress lines."""

    def __init__(self, config: Config, echo: Callable[[str], None] | None) -> None:
        self.total_steps = config.trainer.total_steps
        self.echo = echo
        self.started = time.monotonic()
        self.rewards: list[tuple[int, float]] = []
        self.by_step: dict[int, dict[str, float]] = {}
        self.busy = BusyClock()
        self.legend_shown = False
        self.reward_failures = [0, 0]  # (failed, calls) over the run
        self.summary: dict[str, float] = {}
        self.evals: list[tuple[int, float]] = []  # (version, held-out accuracy)
        self.retired: set[str] = set()  # instances that left the set (psrl scale, lost for good)

    def on_event(self, event: Event[Any]) -> None:
        msg = event.message
        if isinstance(msg, InstanceStatus):
            self.busy.report(msg.instance, event.envelope.mono_ns / 1e9, msg.num_running, msg.is_paused)
        elif isinstance(msg, Metrics) and event.envelope.sender == "coordinator" and "eval/version" in msg.values:
            self._print_eval(msg.values)
        elif isinstance(msg, Metrics) and event.envelope.sender == "coordinator":
            self.by_step.setdefault(msg.step, {}).update(msg.values)
            self._warn_failures(msg)
        elif isinstance(msg, TrainerProgress):
            self._print_step(msg)
        elif isinstance(msg, RunFinished):
            self.summary = dict(msg.summary)
        elif isinstance(msg, ScaleDecided) and not msg.error:
            self.retired.update(msg.removed)
            self._print_scale(msg)

    def _print_scale(self, msg: ScaleDecided) -> None:
        after = [n for n in msg.before if n not in msg.removed] + list(msg.added)
        if self.echo is not None and (msg.added or msg.removed):
            change = " ".join([*(f"+{n}" for n in msg.added), *(f"-{n}" for n in msg.removed)])
            self.echo(f"rollout instances {len(msg.before)} -> {len(after)}: {change} ({msg.reason or 'psrl scale'})")

    def _print_step(self, msg: TrainerProgress) -> None:
        step = self.by_step.pop(msg.step, {})
        if "reward/mean" in step:
            self.rewards.append((msg.step, step["reward/mean"]))
        if self.echo is None:
            return
        reward = step.get("reward/mean", float("nan"))
        staleness = step.get("staleness/mean", float("nan"))
        rate = step.get("throughput/trajectories_per_s", float("nan"))
        util = " ".join(
            f"{name}:{spent.busy:.0%}" for name, spent in sorted(self.busy.take().items()) if name not in self.retired
        )
        elapsed = time.monotonic() - self.started
        if not self.legend_shown:
            self.legend_shown = True
            self.echo(BUSY_LEGEND)
        self.echo(
            f"step {msg.step:>3}/{self.total_steps} | v{msg.version} | reward {reward:.3f} | staleness {staleness:.2f}"
            f"{failure_counts(step)} | {rate:.1f} traj/s | busy {util or '-'} | {elapsed:.0f}s"
        )

    def _warn_failures(self, msg: Metrics) -> None:
        failures = step_failures(msg.values)
        self.reward_failures[0] += failures.num_failed
        self.reward_failures[1] += failures.num_calls
        if self.echo is not None:
            for line in failure_warnings(msg.step, msg.values, msg.notes):
                self.echo(line)

    def _print_eval(self, values: dict[str, float]) -> None:
        version, acc = int(values["eval/version"]), values.get("eval/acc", float("nan"))
        self.evals.append((version, acc))
        if self.echo is not None:
            others = " ".join(
                f"{name[5:]} {v:.3f}" for name, v in sorted(values.items()) if name.startswith("eval/pass@")
            )
            self.echo(f"eval  v{version} | held-out acc {acc:.3f} {others} | mean length "
                      f"{values.get('eval/mean_length', 0):.1f} | {values.get('eval/duration_s', 0):.1f}s")  # fmt: skip

    def summary_lines(self) -> list[str]:
        """First and last step's reward, and the means of the first and last few steps (one buffer's
        reward depends on which prompts it drew, so the means show the trend)."""
        if not self.rewards:
            return []
        first, last = self.rewards[0], self.rewards[-1]
        lines = [f"reward: first step {first[1]:.3f} -> last step {last[1]:.3f}"]
        window = min(SUMMARY_WINDOW, len(self.rewards) // 2)
        if window >= 2:
            head = sum(r for _, r in self.rewards[:window]) / window
            tail = sum(r for _, r in self.rewards[-window:]) / window
            lines.append(f"reward: mean of the first {window} steps {head:.3f} -> of the last {window} {tail:.3f}")
        if self.reward_failures[0]:
            failed, calls = self.reward_failures
            lines.append(
                f"reward calls failed: {failed} of {calls} (scored reward.error_score; see logs/coordinator.log)"
            )
        if len(self.evals) >= 2:
            (v0, a0), (v1, a1) = min(self.evals), max(self.evals)
            lines.append(f"held-out accuracy (greedy, exact match): v{v0} {a0:.3f} -> v{v1} {a1:.3f}")
        return lines


def failure_counts(values: dict[str, float]) -> str:
    """The step line's failure part: reward calls, sessions and generations that failed (empty when none)."""
    reward = step_failures(values)
    parts = [f"reward failed {reward.num_failed}/{reward.num_calls}"] if reward.num_failed else []
    for kind in ("session", "generation"):
        if count := int(values.get(f"{kind}/num_failed", 0)):
            parts.append(f"{count} {kind}{'s' if count > 1 else ''} failed")
    return "".join(f" | {part}" for part in parts)


def failure_warnings(step: int, values: dict[str, float], notes: dict[str, str]) -> list[str]:
    """One console warning per kind of failure in a step, with its count and first error."""
    lines = []
    reward = step_failures(values)
    if reward.num_failed:
        first = notes.get("reward/first_error", "not recorded")
        lines.append(f"warning: step {step}: {reward.num_failed} of {reward.num_calls} reward calls failed "
                     f"({reward.num_errors} raised, {reward.num_timeouts} timed out; scored reward.error_score); "
                     f"first: {first}")  # fmt: skip
    for kind, what in (("session", "sessions (environment or agent)"), ("generation", "generations")):
        if count := int(values.get(f"{kind}/num_failed", 0)):
            first = notes.get(f"{kind}/first_error", "not recorded")
            lines.append(f"warning: step {step}: {count} {what} failed; first: {first}")
    return lines
