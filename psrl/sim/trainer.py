"""The simulated trainer: trains handed-over chunks in order, then the parameter server publishes.

It is the node ``trainer-0`` on the simulation's bus and takes what a trainer rank takes, the
coordinator's ``TrainData``. Chunks queue up in arrival order; each takes ``TrainerModel.chunk_time``.
When the last chunk of buffer ``b`` is trained, version ``b + 1`` exists: the trainer reports
progress at once and the parameter server publishes the version ``publish_s`` later.

The simulator's own staleness check runs here, at hand-over: for every trajectory of a buffer ``b``
it checks ``V_traj <= b <= V_traj + eta`` and that every token was produced by a version in
``[V_traj, b]``, from the data itself (independently of the ledger's count).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from bus.messages import TrainData, TrainerProgress, WeightsPublished
from bus.schema import Message
from psrl.flows.effects import Effect, Publish, Send
from psrl.flows.local import LocalBus
from psrl.sim.events import EventQueue
from psrl.sim.models import TrainerModel
from psrl.sim.stats import SimStats, TrainedStep

NAME = "trainer-0"


@dataclass(frozen=True)
class _Work:
    buffer: int
    is_last: bool
    num_trajectories: int
    num_tokens: int


class SimTrainer:
    def __init__(self, clock: EventQueue, bus: LocalBus, model: TrainerModel, stats: SimStats, staleness: int) -> None:
        self.clock = clock
        self.bus = bus
        self.model = model
        self.stats = stats
        self.staleness = staleness
        self._queue: deque[_Work] = deque()
        self._is_busy = False
        self._buffer_trajectories = 0
        self._buffer_tokens = 0
        self._buffer_train_s = 0.0

    @property
    def is_busy(self) -> bool:
        return self._is_busy

    def handle(self, message: Message, now: float) -> list[Effect]:
        if not isinstance(message, TrainData):
            raise TypeError(f"the simulated trainer takes train.data, not {message.KIND}")
        self.check_staleness(message)
        work = _Work(
            message.buffer,
            message.chunk == message.num_chunks - 1,
            len(message.prompt_ids),
            int(message.response_lengths.sum()),
        )
        self._queue.append(work)
        if not self._is_busy:
            self._start(now)
        return []

    def undeliverable(self, send: Send, now: float) -> list[Effect]:
        return []

    def check_staleness(self, data: TrainData) -> None:
        buffer, stats = data.buffer, self.stats
        versions_per_trajectory = np.split(data.response_versions, np.cumsum(data.response_lengths)[:-1])
        for v_traj, versions in zip(data.v_traj.tolist(), versions_per_trajectory, strict=True):
            staleness = buffer - v_traj
            stats.staleness[staleness] += 1
            stats.num_trained += 1
            if len(versions) and versions.min() != versions.max():
                stats.num_mixed_versions += 1
            if not 0 <= staleness <= self.staleness:
                stats.num_bound_violations += 1
            stats.num_token_version_violations += int(((versions < v_traj) | (versions > buffer)).sum())

    def _start(self, now: float) -> None:
        work = self._queue.popleft()
        self._is_busy = True
        seconds = self.model.chunk_time(work.num_tokens, is_last=work.is_last)
        self.clock.at(now + seconds, lambda end: self._done(work, seconds, end))

    def _done(self, work: _Work, seconds: float, now: float) -> None:
        self._is_busy = False
        self.stats.trainer_busy_s += seconds
        self._buffer_trajectories += work.num_trajectories
        self._buffer_tokens += work.num_tokens
        self._buffer_train_s += seconds
        if work.is_last:
            self._step_done(work.buffer + 1, now)
        if self._queue:
            self._start(now)

    def _step_done(self, step: int, now: float) -> None:
        self.stats.steps.append(
            TrainedStep(step, now, self._buffer_trajectories, self._buffer_tokens, self._buffer_train_s)
        )
        progress = TrainerProgress(
            step=step, version=step, num_samples=self._buffer_trajectories, step_s=self._buffer_train_s
        )
        self._buffer_trajectories = self._buffer_tokens = 0
        self._buffer_train_s = 0.0
        self.bus.post(NAME, [Publish(progress, model_version=step)], now)
        published = WeightsPublished(version=step, manifest_digest="", num_shards=1)
        self.clock.at(now + self.model.publish_s, lambda t: self.bus.post("ps", [Publish(published)], t))
