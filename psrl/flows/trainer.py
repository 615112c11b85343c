"""A trainer rank's algorithm: train on the buffers handed over, chunk by chunk, then push the version.

Every rank gets the same ``TrainData`` chunks (the core splits them by rank). When a buffer is
fully trained (under ``pre_step``, after its last chunk) the flow asks for the new version to be
pushed (``PushWeights``); the driver pushes it and reports the step (``TrainerProgress``).
Buffers already trained (resent after a restart) and buffers beyond the last step are skipped;
malformed data is counted and dropped.
"""

from __future__ import annotations

from typing import Any

from bus.messages import Metrics, TrainData
from bus.schema import Message
from psrl.config import Config
from psrl.evaluation import certificate
from psrl.flows.base import Flow
from psrl.flows.effects import Handler, PushWeights
from psrl.flows.train_data import trajectories_from
from psrl.rl.trajectory import InvalidTrajectoryError
from psrl.trainer import StepResult, TrainerCore


class TrainerFlow(Flow):
    def __init__(self, config: Config, core: TrainerCore, *, log: Any = None) -> None:
        super().__init__()
        self.core = core
        self.total_steps = config.trainer.total_steps
        self.responses_per_prompt = config.responses_per_prompt
        self.log = log
        self.num_samples = 0  # trajectories of the step in progress
        self.step_started = 0.0
        self.num_malformed = 0
        self.chunks: list[TrainData] = []  # of the buffer in progress, for its staleness certificate
        correction = config.algorithm.rollout_correction
        self.is_threshold = correction.rollout_is_threshold if correction.rollout_is == "token" else 0.0
        self.publishes_certificate = core.parallel.rank == 0

    def handlers(self) -> dict[type[Message], Handler]:
        return {TrainData: self._on_data}  # from the coordinator: a chunk of a buffer

    def _on_data(self, data: TrainData, now: float) -> None:
        if data.buffer < self.core.version:  # already trained (a resent buffer after a restart)
            if self.log is not None:
                self.log.info("skipping trained buffer", buffer=data.buffer, version=self.core.version)
            return
        if data.buffer >= self.total_steps:  # handed over ahead; the run ends first
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
        self.chunks.append(data)
        result = self.core.add_chunk(data.buffer, trajectories, is_last=data.chunk == data.num_chunks - 1)
        if result is not None:
            self._after_step(data, result)

    def _after_step(self, data: TrainData, result: StepResult) -> None:
        self.publish(Metrics(step=data.buffer + 1, values=dict(result.metrics)), model_version=result.version)
        if result.is_push_ready and self.publishes_certificate:
            cert = certificate.build(
                self.chunks,
                result.version,
                result.trajectory_is,
                responses_per_prompt=self.responses_per_prompt,
                threshold=self.is_threshold,
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
