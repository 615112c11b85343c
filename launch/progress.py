"""Console progress of a run: one line per training step, from the run's own events."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bus.messages import InstanceStatus, Metrics, RunFinished, TrainerProgress
from bus.schema import Event
from psrl.config import Config

SUMMARY_WINDOW = 5


class ProgressView:
    """Turns TrainerProgress / Metrics / InstanceStatus events into progress lines."""

    def __init__(self, config: Config, echo: Callable[[str], None] | None) -> None:
        self.total_steps = config.trainer.total_steps
        self.echo = echo
        self.started = time.monotonic()
        self.rewards: list[tuple[int, float]] = []
        self.by_step: dict[int, dict[str, float]] = {}
        self.busy: dict[str, list[int]] = {}
        self.summary: dict[str, float] = {}
        self.evals: list[tuple[int, float]] = []  # (version, held-out accuracy)

    def on_event(self, event: Event[Any]) -> None:
        msg = event.message
        if isinstance(msg, InstanceStatus):
            seen = self.busy.setdefault(msg.instance, [0, 0])
            seen[0] += int(msg.num_running > 0)
            seen[1] += 1
        elif isinstance(msg, Metrics) and event.envelope.sender == "coordinator" and "eval/version" in msg.values:
            self._print_eval(msg.values)
        elif isinstance(msg, Metrics) and event.envelope.sender == "coordinator":
            self.by_step.setdefault(msg.step, {}).update(msg.values)
        elif isinstance(msg, TrainerProgress):
            self._print_step(msg)
        elif isinstance(msg, RunFinished):
            self.summary = dict(msg.summary)

    def _print_step(self, msg: TrainerProgress) -> None:
        step = self.by_step.pop(msg.step, {})
        if "reward/mean" in step:
            self.rewards.append((msg.step, step["reward/mean"]))
        if self.echo is None:
            return
        reward = step.get("reward/mean", float("nan"))
        staleness = step.get("staleness/mean", float("nan"))
        rate = step.get("throughput/trajectories_per_s", float("nan"))
        util = " ".join(f"{name}:{busy / max(seen, 1):.0%}" for name, (busy, seen) in sorted(self.busy.items()))
        self.busy = {name: [0, 0] for name in self.busy}
        elapsed = time.monotonic() - self.started
        self.echo(
            f"step {msg.step:>3}/{self.total_steps} | v{msg.version} | reward {reward:.3f} | staleness {staleness:.2f}"
            f" | {rate:.1f} traj/s | busy {util or '-'} | {elapsed:.0f}s"
        )

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
        if len(self.evals) >= 2:
            (v0, a0), (v1, a1) = min(self.evals), max(self.evals)
            lines.append(f"held-out accuracy (greedy, exact match): v{v0} {a0:.3f} -> v{v1} {a1:.3f}")
        return lines
