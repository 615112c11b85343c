"""A trainer rank: trains on the buffers the coordinator hands over, pushes each new version.

Every rank gets the same `train.data` chunks (the core splits them by rank); rank 0 pushes the
new weights to the parameter-server shards once a buffer is fully trained (under `pre_step`
only after its last chunk), then publishes `TrainerProgress`. Checkpoints go to the run
directory; a restarted trainer resumes from the latest one and keeps the version numbering.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from actors.base import Actor, handles
from actors.boot import CHECKPOINT_ON_STOP
from actors.links import Link
from bus.messages import ActorState, Metrics, TrainData, TrainerProgress, WeightsPushed
from bus.messages import FinishReason as BusFinish
from bus.schema import Event
from psrl.ps.from_config import make_pusher
from psrl.ps.staging import HostStaging
from psrl.rl.trajectory import FinishReason, InvalidTrajectoryError, Trajectory
from psrl.trainer import ParallelContext, StepResult, TrainerCore, latest_checkpoint

_FINISH = {int(BusFinish.STOP): FinishReason.STOP, int(BusFinish.LENGTH): FinishReason.LENGTH,
           int(BusFinish.ABORT): FinishReason.ABORT}  # fmt: skip


class TrainerActor(Actor):
    ROLE = "trainer"

    def setup(self) -> dict[str, int]:
        cfg = self.config
        self.rank, self.world_size = self.boot.index, cfg.topology.n_trainer_ranks
        if self.world_size > 1:
            host, port = str(self.boot.options["dist_master"]).rsplit(":", 1)
            # a rank placed on its own GPU sees only that one (topology.trainer_gpus)
            local_rank = 0 if "cuda_visible_devices" in self.boot.options else self.rank
            os.environ.update(MASTER_ADDR=host, MASTER_PORT=port, RANK=str(self.rank),
                              WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(local_rank))  # fmt: skip
        self.parallel = ParallelContext.from_env(cfg.topology.device)
        self.core = TrainerCore(cfg, parallel=self.parallel)
        self.checkpoints = Path(self.boot.run_dir) / "checkpoints" if self.boot.run_dir else None
        if cfg.trainer.resume and self.checkpoints is not None and (path := latest_checkpoint(self.checkpoints)):
            self.core.load_checkpoint(path)
            self.log.info("resumed", checkpoint=str(path), version=self.core.version)
        self.saved_version = self.core.version
        self.link = Link(self.ctx, self.boot.endpoint(self.name), sender=self.name, incarnation=self.boot.incarnation,
                         settings=self.bus, serve=True)  # fmt: skip
        self.add_input(self.link.socket, self._on_link)
        self.pusher = None
        self.staging = HostStaging()  # a GPU trainer's weights go to the PS from host memory
        if self.rank == 0:
            shards = [self.boot.endpoint(f"ps-{i}") for i in range(cfg.topology.n_ps_shards)]
            self.pusher = make_pusher(cfg, shards, self.boot.incarnation)
        self.num_samples = 0
        if self.core.version > 0:  # a resumed run: the fresh parameter server needs the current version
            weights = dict(self.core.named_weights())
            if self.pusher is not None:
                self.pusher.push(self.core.version, self.staging.stage(weights))
        return {"version": self.core.version}

    def _on_link(self) -> None:
        received = self.link.recv()
        if received is not None:
            for event in received[1]:
                self.dispatch(event)

    @handles(TrainData, link=True, fatal=True)  # a failed step or push must not leave the run waiting
    def _on_data(self, event: Event[TrainData]) -> None:
        data = event.message
        if data.buffer < self.core.version:  # already trained (a resent buffer after a restart)
            self.log.info("skipping trained buffer", buffer=data.buffer, version=self.core.version)
            return
        if data.buffer >= self.config.trainer.total_steps:  # handed over ahead; the run ends first
            return
        if data.chunk == 0:
            self.buffer_started = time.monotonic()
        try:
            trajectories = trajectories_from(data, self.config.responses_per_prompt)
        except (InvalidTrajectoryError, ValueError, IndexError, TypeError) as exc:  # malformed input: dropped
            self.num_handler_errors += 1
            self.log.error("malformed train data dropped", buffer=data.buffer, chunk=data.chunk, error=repr(exc))
            return
        self.num_samples += len(trajectories)
        result = self.core.add_chunk(data.buffer, trajectories, is_last=data.chunk == data.num_chunks - 1)
        if result is not None:
            self._after_step(data, result)

    def _after_step(self, data: TrainData, result: StepResult) -> None:
        self.publisher.publish(Metrics(data.buffer + 1, dict(result.metrics)), model_version=result.version)
        if not result.is_push_ready:
            return
        started = time.monotonic()
        weights = dict(self.core.named_weights())  # a collective under FSDP2: every rank iterates
        if self.pusher is not None:
            pushed = self.pusher.push(result.version, self.staging.stage(weights))
            self.publisher.publish(WeightsPushed(result.version, self.rank, pushed.num_bytes),
                                   model_version=result.version)  # fmt: skip
            self.publisher.publish(Metrics(data.buffer + 1, {
                "sync/push_s": pushed.total_s, "sync/serialize_s": pushed.serialize_s,
                "sync/transfer_s": pushed.transfer_s, "sync/commit_s": pushed.commit_s,
            }), model_version=result.version)  # fmt: skip
        self._maybe_checkpoint(result.version)
        step_s = time.monotonic() - getattr(self, "buffer_started", started)
        self.publisher.publish(TrainerProgress(data.buffer + 1, result.version, self.num_samples, step_s),
                               model_version=result.version)  # fmt: skip
        self.num_samples = 0

    def _maybe_checkpoint(self, version: int) -> None:
        freq, total = self.config.trainer.save_freq, self.config.trainer.total_steps
        if version >= total or (freq and version % freq == 0):
            self._checkpoint()

    def _checkpoint(self) -> None:
        if self.checkpoints is None:
            return
        path = self.core.save_checkpoint(self.checkpoints, keep=self.config.trainer.keep_checkpoints)
        self.saved_version = self.core.version
        self.log.info("checkpoint", path=str(path), version=self.core.version)

    def _checkpoint_on_stop(self) -> None:
        """A run stopped early keeps every version trained so far (a half-trained buffer is retrained)."""
        if not hasattr(self, "core") or self.state == ActorState.DEAD or self.core.version <= self.saved_version:
            return
        if not self.core.discard_partial_buffer():
            self.log.warning("no checkpoint on stop: a pre_step buffer is half-applied", version=self.core.version)
            return
        self.log.info("checkpoint on stop", reason=self.stop_reason, version=self.core.version)
        # tells the launcher to wait for the save (up to trainer.stop_save_timeout_s) before terminating
        self.set_state(ActorState.DRAINING, CHECKPOINT_ON_STOP)
        self._checkpoint()

    def teardown(self) -> None:
        self._checkpoint_on_stop()
        if hasattr(self, "link"):
            self.link.close()
        if getattr(self, "pusher", None) is not None:
            self.pusher.close()  # type: ignore[union-attr]
        if hasattr(self, "parallel"):
            self.parallel.close()


def trajectories_from(data: TrainData, responses_per_prompt: int) -> list[Trajectory]:
    """Split a flattened TrainData into the trainer's Trajectory records."""
    out = []
    p_off = r_off = 0
    has_logprobs = len(data.response_logprobs) == len(data.response_token_ids)
    for i in range(len(data.prompt_ids)):
        p_len, r_len = int(data.prompt_lengths[i]), int(data.response_lengths[i])
        prompt = data.prompt_token_ids[p_off : p_off + p_len]
        span = slice(r_off, r_off + r_len)
        p_off, r_off = p_off + p_len, r_off + r_len
        out.append(Trajectory(
            prompt_id=int(data.prompt_ids[i]),
            child=int(data.request_ids[i]) % responses_per_prompt,
            prompt_token_ids=tuple(int(t) for t in prompt),
            response_token_ids=tuple(int(t) for t in data.response_token_ids[span]),
            rollout_log_probs=tuple(float(x) for x in data.response_logprobs[span]) if has_logprobs else (),
            token_versions=tuple(int(v) for v in data.response_versions[span]),
            version=int(data.v_traj[i]),
            reward=float(data.rewards[i]),
            acc=float(data.accs[i]),
            finish_reason=_FINISH.get(int(data.finish_reasons[i]), FinishReason.STOP),
        ))  # fmt: skip
    return out
