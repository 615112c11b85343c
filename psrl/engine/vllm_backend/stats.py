"""vLLM's own statistics, collected as vLLM hands them to its stat loggers after every step.

`VllmStatistics` is registered as a per-engine stat logger (vLLM calls `record` with the step's
`SchedulerStats` and `IterationStats`); the engine's status snapshot reads it. Prefix-cache
counters restart when vLLM reports a cache reset, as the embedded engine's do.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

THROUGHPUT_WINDOW_S = 5.0


class VllmStatistics:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.num_running = 0
        self.num_waiting = 0
        self.kv_cache_usage = 0.0
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_preemptions_total = 0
        self.num_generated_tokens_total = 0
        self.last_step_tokens = 0  # prompt tokens admitted + tokens generated in the latest step
        self._recent_steps: deque[tuple[float, int]] = deque()

    # the stat-logger interface vLLM calls (a per-engine logger; see vllm.v1.metrics.loggers)
    def __call__(self, vllm_config: Any, engine_index: int = 0) -> VllmStatistics:
        return self  # vLLM builds per-engine loggers from factories; this one already exists

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:  # fmt: skip
        if scheduler_stats is not None:
            self._record_scheduler(scheduler_stats)
        if iteration_stats is not None:
            self._record_iteration(iteration_stats)

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass

    # ------------------------------------------------------------------

    def _record_scheduler(self, stats: Any) -> None:
        self.num_running = stats.num_running_reqs
        self.num_waiting = stats.num_waiting_reqs + getattr(stats, "num_skipped_waiting_reqs", 0)
        self.kv_cache_usage = stats.kv_cache_usage
        prefix = stats.prefix_cache_stats
        if prefix is None:
            return
        if prefix.reset:
            self.num_prefix_queried_tokens = self.num_prefix_hit_tokens = 0
        self.num_prefix_queried_tokens += prefix.queries + getattr(prefix, "preempted_queries", 0)
        self.num_prefix_hit_tokens += prefix.hits + getattr(prefix, "preempted_hits", 0)

    def _record_iteration(self, stats: Any) -> None:
        now = self._clock()
        generated = stats.num_generation_tokens
        self.num_generated_tokens_total += generated
        self.num_preemptions_total += stats.num_preempted_reqs
        self.last_step_tokens += stats.num_prompt_tokens + generated
        self._recent_steps.append((now, generated))
        self._forget_steps_before(now - THROUGHPUT_WINDOW_S)

    def _forget_steps_before(self, cutoff: float) -> None:
        while self._recent_steps and self._recent_steps[0][0] < cutoff:
            self._recent_steps.popleft()

    def take_step_tokens(self) -> int:
        tokens, self.last_step_tokens = self.last_step_tokens, 0
        return tokens

    @property
    def prefix_hit_rate(self) -> float:
        queried = self.num_prefix_queried_tokens
        return self.num_prefix_hit_tokens / queried if queried else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Tokens generated per second over the last THROUGHPUT_WINDOW_S; 0 once the engine has been idle
        that long (the window is cut at read time too, or an idle engine would report its last busy rate)."""
        self._forget_steps_before(self._clock() - THROUGHPUT_WINDOW_S)
        steps = self._recent_steps
        if len(steps) < 2:
            return 0.0
        elapsed = steps[-1][0] - steps[0][0]
        return sum(count for _, count in list(steps)[1:]) / elapsed if elapsed > 0 else 0.0
