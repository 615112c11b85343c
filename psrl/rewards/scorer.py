"""Scoring responses in the coordinator: a task's own reward, or a user's reward function.

A reward call never ends the run. A call that raises, times out (reward.timeout_s) or returns
something that is not a finite number (or a dict with a finite `score`) scores
`reward.error_score`; each is counted (`reward/num_errors`, `reward/num_timeouts` in the buffer
metrics) and logged, the first few in full and then every hundredth. The first error of each step
goes to the console with the step's counts, and too many failing steps in a row stop the run
(`psrl.rewards.failures`).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

from psrl.config.data import RewardSettings
from psrl.log import get_logger
from psrl.rewards.loader import RewardFunction
from psrl.tasks.base import Prompt, Reward, Task

_LOG_FIRST = 5
_LOG_EVERY = 100


class Scorer(Protocol):
    def score(self, prompt: Prompt, response: str, response_ids: Sequence[int]) -> Reward: ...

    def take_metrics(self) -> dict[str, float]:
        """Counters and reward components since the last call (for the buffer's metrics)."""
        ...

    def take_first_error(self) -> str:
        """The first failed call's error since the last call ('' when none failed)."""
        ...

    def close(self) -> None: ...


class InvalidRewardError(ValueError):
    """A reward function returned something that is not a score."""


def to_reward(value: Any) -> tuple[Reward, dict[str, float]]:
    """(Reward, extra components) from a function's return value; raises InvalidRewardError."""
    if isinstance(value, dict):
        if "score" not in value:
            raise InvalidRewardError(f"a dict reward needs a 'score' entry, got keys {sorted(value)[:8]}")
        score = _finite(value["score"], "score")
        extras = {str(k): _finite(v, str(k)) for k, v in value.items() if k not in ("score", "acc")}
        acc = _finite(value["acc"], "acc") if "acc" in value else _default_acc(score)
        return Reward(score, acc), extras
    score = _finite(value, "score")
    return Reward(score, _default_acc(score)), {}


def _finite(value: Any, name: str) -> float:
    if isinstance(value, bool | int | float) or hasattr(value, "__float__"):
        number = float(value)
        if math.isfinite(number):
            return number
    raise InvalidRewardError(f"{name} must be a finite number, got {type(value).__name__}: {str(value)[:60]}")


def _default_acc(score: float) -> float:
    return 1.0 if score >= 1.0 else 0.0


class _Counters:
    def __init__(self, source: str) -> None:
        self.log = get_logger("psrl.rewards", function=source)
        self.counts: Counter[str] = Counter()
        self.sums: dict[str, float] = {}
        self.first_error = ""
        self.lock = threading.Lock()

    def failed(self, kind: str, prompt: Prompt, detail: str) -> None:
        with self.lock:
            self.counts[kind] += 1
            total = self.counts["num_errors"] + self.counts["num_timeouts"]
            if not self.first_error:
                self.first_error = detail
        if total <= _LOG_FIRST or total % _LOG_EVERY == 0:
            self.log.warning("reward failed; scored reward.error_score", kind=kind, prompt=prompt.index,
                             detail=detail, num_failed=total)  # fmt: skip

    def scored(self, extras: dict[str, float]) -> None:
        with self.lock:
            self.counts["num_scored"] += 1
            for key, value in extras.items():
                self.sums[key] = self.sums.get(key, 0.0) + value
                self.counts[f"n:{key}"] += 1

    def take(self) -> dict[str, float]:
        with self.lock:
            out = {f"reward/{k}": float(v) for k, v in self.counts.items() if not k.startswith("n:")}
            out.update({f"reward/{k}": v / self.counts[f"n:{k}"] for k, v in self.sums.items()})
            self.counts.clear()
            self.sums.clear()
        return out

    def take_first_error(self) -> str:
        with self.lock:
            first, self.first_error = self.first_error, ""
        return first


class TaskScorer:
    """A registered task's reward (the demo tasks)."""

    def __init__(self, task: Task, error_score: float = 0.0) -> None:
        self.task = task
        self.error_score = error_score
        self.counters = _Counters(f"task:{getattr(task, 'name', '?')}")

    def score(self, prompt: Prompt, response: str, response_ids: Sequence[int]) -> Reward:
        try:
            reward = self.task.reward(prompt, response)
        except Exception as exc:
            self.counters.failed("num_errors", prompt, f"{type(exc).__name__}: {exc}")
            return Reward(self.error_score, 0.0)
        self.counters.scored({})
        return reward

    def take_metrics(self) -> dict[str, float]:
        return self.counters.take()

    def take_first_error(self) -> str:
        return self.counters.take_first_error()

    def close(self) -> None:
        pass


class FunctionScorer:
    """A user's reward function (sync in a thread pool, async on one event-loop thread), with a timeout."""

    def __init__(self, function: RewardFunction, settings: RewardSettings) -> None:
        self.function = function
        self.settings = settings
        self.counters = _Counters(function.spec)
        self.pool = ThreadPoolExecutor(settings.num_workers, thread_name_prefix="reward")
        self.loop: asyncio.AbstractEventLoop | None = None
        if function.is_async:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="reward-async", daemon=True).start()

    def arguments(self, prompt: Prompt, response: str, response_ids: Sequence[int]) -> dict[str, Any]:
        available: dict[str, Any] = {**prompt.row, **self.settings.kwargs}
        available.update(
            prompt=prompt.text, response=response, prompt_ids=list(prompt.token_ids),
            response_ids=[int(t) for t in response_ids], answer=prompt.answer, row=dict(prompt.row),
        )  # fmt: skip
        return self.function.select(available)

    def score(self, prompt: Prompt, response: str, response_ids: Sequence[int]) -> Reward:
        kwargs = self.arguments(prompt, response, response_ids)
        future = self._submit(kwargs)
        try:
            reward, extras = to_reward(future.result(timeout=self.settings.timeout_s))
        except FutureTimeout:
            future.cancel()
            self.counters.failed("num_timeouts", prompt, f"no result within {self.settings.timeout_s} s")
            return Reward(self.settings.error_score, 0.0)
        except Exception as exc:
            self.counters.failed("num_errors", prompt, f"{type(exc).__name__}: {exc}")
            return Reward(self.settings.error_score, 0.0)
        self.counters.scored(extras)
        return reward

    def _submit(self, kwargs: dict[str, Any]) -> Future[Any]:
        if self.loop is not None:
            return asyncio.run_coroutine_threadsafe(self.function.fn(**kwargs), self.loop)
        return self.pool.submit(self.function.fn, **kwargs)

    def take_metrics(self) -> dict[str, float]:
        return self.counters.take()

    def take_first_error(self) -> str:
        return self.counters.take_first_error()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
