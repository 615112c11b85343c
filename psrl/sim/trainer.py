"""The simulated trainer: trains handed-over chunks in order, then the parameter server publishes.

Chunks queue up in arrival order; each takes ``TrainerModel.chunk_time``. When the last chunk of
buffer ``b`` is trained, version ``b + 1`` exists: the trainer reports progress at once and the
parameter server publishes the version ``publish_s`` later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from psrl.sim.events import EventQueue
from psrl.sim.models import TrainerModel
from psrl.sim.stats import SimStats, TrainedStep


@dataclass(frozen=True)
class TrainChunk:
    buffer: int
    is_last: bool
    num_trajectories: int
    num_tokens: int


class SimTrainer:
    def __init__(
        self,
        clock: EventQueue,
        model: TrainerModel,
        stats: SimStats,
        on_progress: Callable[[int, float], None],
        on_published: Callable[[int, float], None],
    ) -> None:
        self.clock = clock
        self.model = model
        self.stats = stats
        self.on_progress = on_progress
        self.on_published = on_published
        self._queue: deque[TrainChunk] = deque()
        self._is_busy = False
        self._buffer_trajectories = 0
        self._buffer_tokens = 0
        self._buffer_train_s = 0.0

    @property
    def is_busy(self) -> bool:
        return self._is_busy

    def enqueue(self, chunk: TrainChunk, now: float) -> None:
        self._queue.append(chunk)
        if not self._is_busy:
            self._start(now)

    def _start(self, now: float) -> None:
        chunk = self._queue.popleft()
        self._is_busy = True
        seconds = self.model.chunk_time(chunk.num_tokens, is_last=chunk.is_last)
        self.clock.at(now + seconds, lambda end: self._done(chunk, seconds, end))

    def _done(self, chunk: TrainChunk, seconds: float, now: float) -> None:
        self._is_busy = False
        self.stats.trainer_busy_s += seconds
        self._buffer_trajectories += chunk.num_trajectories
        self._buffer_tokens += chunk.num_tokens
        self._buffer_train_s += seconds
        if chunk.is_last:
            step = chunk.buffer + 1
            self.stats.steps.append(TrainedStep(step, now, self._buffer_trajectories, self._buffer_tokens,
                                                self._buffer_train_s))  # fmt: skip
            self._buffer_trajectories = self._buffer_tokens = 0
            self._buffer_train_s = 0.0
            self.on_progress(step, now)
            self.clock.at(now + self.model.publish_s, lambda t: self.on_published(step, t))
        if self._queue:
            self._start(now)
