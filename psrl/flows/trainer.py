"""A trainer rank's algorithm: train on the buffers handed over, chunk by chunk, then push the version.

Every rank gets the same ``TrainData`` chunks (the core splits them by rank). When a buffer is
fully trained (under ``pre_step``, after its last chunk) the flow asks for the new version to be
pushed (``PushWeights``); the driver pushes it and reports the step (``TrainerProgress``).
Buffers already trained and chunks already here (resent after a restart) and buffers beyond the
last step are skipped;
malformed data is counted and dropped.
"""

from __future__ import annotations

from typing import Any

from bus.messages import MemoryPause, MemoryResume, Metrics, TrainData
from bus.schema import Message
from psrl.config import Config
from psrl.evaluation import certificate
from psrl.flows.base import Flow
from psrl.flows.effects import Handler, PushWeights
from psrl.flows.memory import MemorySwitcher
from psrl.flows.train_data import trajectories_from
from psrl.rl.correction import spec_of
from psrl.rl.trajectory import InvalidTrajectoryError
from psrl.trainer import TrainerCore, TrainStepResult


class TrainerFlow(Flow):
    BUS_KINDS = (MemoryPause, MemoryResume)

    def __init__(self, config: Config, core: TrainerCore, *, name: str = "trainer-0", log: Any = None) -> None:
        super().__init__()
        self.core = core
        self.memory = MemorySwitcher(name, core.memory.pause, core.memory.resume)
        self.held: list[TrainData] = []  # data that arrived while the GPU memory was released
        self.total_steps = config.trainer.total_steps
        self.responses_per_prompt = config.responses_per_prompt
        self.log = log
        self.num_samples = 0  # trajectories of the step in progress
        self.step_started = 0.0
        self.num_malformed = 0
        self.chunks_seen: set[tuple[int, int]] = set()  # (buffer, chunk) of the buffer in progress
        self.chunks: list[TrainData] = []  # of the buffer in progress, for its staleness certificate
        # chunks of buffers beyond the one in progress, by buffer and chunk: a replacement rank can get a
        # new buffer before the coordinator's re-sent older ones (it was queued for the dead rank first)
        self.ahead: dict[int, dict[int, TrainData]] = {}
        correction = config.algorithm.rollout_correction
        spec = spec_of(correction)
        self.is_threshold = correction.rollout_is_threshold if spec.is_level is not None else 0.0
        loss = config.algorithm.policy_loss.loss_mode
        self.correction = spec.describe() + ("" if loss == "ppo" else f";loss={loss}")
        self.publishes_certificate = core.parallel.rank == 0

    def handlers(self) -> dict[type[Message], Handler]:
        return {
            TrainData: self._on_data,  # from the coordinator: a chunk of a buffer
            MemoryPause: self._on_memory_pause,  # colocation: rollout takes the GPUs
            MemoryResume: self._on_memory_resume,  # colocation: the trainer's turn
        }

    def _on_memory_pause(self, command: MemoryPause, now: float) -> None:
        report = self.memory.pause(command)
        if report is not None:
            self.publish(report)

    def _on_memory_resume(self, command: MemoryResume, now: float) -> None:
        report = self.memory.resume(command)
        if report is None:
            return
        self.publish(report)
        held, self.held = self.held, []
        for data in held:
            self._on_data(data, now)

    def _on_data(self, data: TrainData, now: float) -> None:
        if self.memory.is_paused:  # trained once the coordinator hands the GPUs back
            self.held.append(data)
            return
        if data.buffer < self.core.version:  # already trained (a resent buffer after a restart)
            if self.log is not None:
                self.log.info("skipping trained buffer", buffer=data.buffer, version=self.core.version)
            return
        if data.buffer >= self.total_steps:  # handed over ahead; the run ends first
            return
        if (data.buffer, data.chunk) in self.chunks_seen:  # re-sent after a restart, and already here
            return
        if data.buffer > self.core.version:  # trained once the buffers before it are
            self.ahead.setdefault(data.buffer, {})[data.chunk] = data
            return
        if data.chunk == 0:
            self.step_started = now
            self.chunks = []
        try:
            trajectories = trajectories_from(data, self.responses_per_prompt)
        except (InvalidTrajectoryError, ValueError, IndexError, TypeError) as exc:  # malformed input: dropped
            self.num_malformed += 1
            if self.log is not None:
                self.log.error("malformed train data dropped", buffer=data.buffer, chunk=data.chunk, error=repr(exc))
            return
        self.num_samples += len(trajectories)
        self.chunks_seen = {seen for seen in self.chunks_seen if seen[0] == data.buffer} | {(data.buffer, data.chunk)}
        self.chunks.append(data)
        result = self.core.add_chunk(data.buffer, trajectories, is_last=data.chunk == data.num_chunks - 1)
        if result is not None:
            self._after_step(data, result)
            self._train_ahead(now)

    def _train_ahead(self, now: float) -> None:
        """The held chunks of the buffer the trainer has reached, in order (each may reach the next)."""
        for buffer in [b for b in self.ahead if b < self.core.version]:
            del self.ahead[buffer]
        chunks = self.ahead.pop(self.core.version, {})
        for chunk in sorted(chunks):
            self._on_data(chunks[chunk], now)

    def _after_step(self, data: TrainData, result: TrainStepResult) -> None:
        self.publish(Metrics(step=data.buffer + 1, values=dict(result.metrics)), model_version=result.version)
        if result.is_push_ready and self.publishes_certificate:
            cert = certificate.build(
                self.chunks,
                result.version,
                result.trajectory_is,
                responses_per_prompt=self.responses_per_prompt,
                threshold=self.is_threshold,
                masked=result.trajectory_masked,
                correction=self.correction,
            )
            self.publish(cert, model_version=result.version)
            self.chunks = []
        if result.is_push_ready:
            self.emit(
                PushWeights(
                    version=result.version,
                    step=data.buffer + 1,
                    num_samples=self.num_samples,
                    started_s=self.step_started,
                )
            )
            self.num_samples = 0
