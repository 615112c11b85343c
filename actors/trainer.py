"""A trainer rank: ``psrl.flows.TrainerFlow`` on the rank's link, pushing each new version to the PS.

Every rank gets the same ``train.data`` chunks on its link; rank 0 pushes the new weights to the
parameter-server shards once a buffer is fully trained, then reports the step (``TrainerProgress``).
Checkpoints go to the run directory; a restarted trainer resumes from the latest one and keeps
the version numbering: when the parameter server already committed a newer version, the
replacement continues from that version's weights (and the coordinator re-sends the buffers not
yet trained), so it never pushes a version twice. A failed step or push ends the actor (its restart policy applies).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from actors.base import Inputs
from actors.boot import CHECKPOINT_ON_STOP
from actors.flow_actor import FlowActor
from bus.messages import ActorState, Metrics, TrainData, TrainerProgress, WeightsPushed
from bus.schema import Event
from psrl.checkpoint_dirs import version_of
from psrl.engine.args import EngineArgs
from psrl.flows.effects import Effect, PushWeights
from psrl.flows.trainer import TrainerFlow
from psrl.ps.from_config import make_puller, make_pusher, staging_dtype
from psrl.ps.pusher import PushResult
from psrl.ps.staging import HostStaging, WeightSnapshot, pushed_num_bytes
from psrl.tms import TRAINER
from psrl.tms.backend import side_memory
from psrl.trainer import ParallelContext, TrainerCore, latest_checkpoint
from psrl.trainer.background import BackgroundJob
from psrl.trainer.compiled import compile_enabled
from psrl.trainer.threads import CpuSampler, ThreadTrials
from psrl.trainer.warm_up import warm_up_enabled


@dataclass(frozen=True)
class _Pushed:
    effect: PushWeights
    result: PushResult
    waited_s: float | None = None  # in the background: how long the step waited for the previous push


class TrainerActor(FlowActor):
    ROLE = "trainer"
    WARM_IMPORTS = (
        *FlowActor.WARM_IMPORTS,
        "torch",
        "safetensors",
        "transformers",
        "psrl.trainer",
        "psrl.models.llama",
    )
    SERVES_REQUESTS = True
    FLOW = TrainerFlow
    flow: TrainerFlow

    def inputs(self) -> Inputs:
        # a failed step or push must not leave the run waiting: the actor ends and is restarted
        # the flow's bus kinds too: colocation's tms.pause / tms.resume reach the trainer on the bus
        bus = super().inputs().bus
        return Inputs(link={TrainData: self._on_train_data}, bus=bus, fatal=frozenset({TrainData}))

    def _on_train_data(self, event: Event[TrainData]) -> None:
        # never more threads than cores: the launcher may have pinned this process to fewer since the
        # pool was sized, and OpenMP threads sharing a core wait on each other at every barrier
        if self.cpu is not None and torch.get_num_threads() > self.cpu.num_cores:
            torch.set_num_threads(self.cpu.num_cores)
        self._finish_warm_up()
        self.to_flow(event)

    def setup(self) -> dict[str, int]:
        cfg = self.config
        self.rank, self.world_size = self.boot.index, cfg.topology.n_trainer_ranks
        if self.world_size > 1:
            host, port = str(self.boot.options["dist_master"]).rsplit(":", 1)
            # a rank placed on its own GPU sees only that one (topology.trainer_gpus)
            local_rank = 0 if "cuda_visible_devices" in self.boot.options else self.rank
            os.environ.update(
                MASTER_ADDR=host,
                MASTER_PORT=port,
                RANK=str(self.rank),
                WORLD_SIZE=str(self.world_size),
                LOCAL_RANK=str(local_rank),
            )
        self.parallel = ParallelContext.from_env(cfg.topology.device)
        self.core = TrainerCore(cfg, parallel=self.parallel, memory=side_memory(cfg, TRAINER))
        self.checkpoints = Path(self.boot.run_dir) / "checkpoints" if self.boot.run_dir else None
        if cfg.trainer.resume and self.checkpoints is not None and (path := latest_checkpoint(self.checkpoints)):
            self.core.load_checkpoint(path)
            self.log.info("resumed", checkpoint=str(path), version=self.core.version)
        committed = -1  # the parameter server's version; a fresh (or resumed) run's PS holds none
        if self.boot.options.get("restarted"):  # every rank of a re-formed group adopts the same committed version
            committed = self._catch_up_with_ps()
        self.saved_version = self.core.version
        self.writer: BackgroundJob[Path] = BackgroundJob(self._written, name="checkpoint-writer")
        self.pusher = None
        self.pushes: BackgroundJob[_Pushed] | None = None
        # a GPU trainer's weights go to the PS in the dtype shards serve: straight into the shards' shared
        # memory where the transport allows, else from host staging buffers
        engine_args = EngineArgs.from_config(cfg)
        self.staging = HostStaging(staging_dtype(cfg, engine_args.resolve_dtype(engine_args.resolve_device())))
        if self.rank == 0:
            shards = [self.boot.endpoint(f"ps-{i}") for i in range(cfg.topology.n_ps_shards)]
            self.pusher = make_pusher(cfg, shards, self.boot.incarnation, curve=self.bus.options.curve)
            self._start_push_thread()
        if self.core.version > max(committed, 0):  # a resumed run: the fresh parameter server needs it
            weights = dict(self.core.named_weights())
            if self.pusher is not None:
                self.pusher.push_weights(self.core.version, weights, self.staging)
        self.attach(
            TrainerFlow(cfg, self.core, name=self.name, log=self.log), serving=self.make_link(self.name, serve=True)
        )
        self.warm_up = self._start_warm_up()
        adapts = cfg.topology.trainer_threads == "auto" and self.parallel.device.type == "cpu"
        self.cpu = CpuSampler() if adapts else None
        self.thread_trials: ThreadTrials | None = None
        return {"version": self.core.version}

    def _start_warm_up(self) -> BackgroundJob[float | None] | None:
        """The compiled layers built on a synthetic buffer while the first batch is generated (actor.warm_up)."""
        cfg = self.config
        compiles = compile_enabled(cfg.actor.compile, self.parallel.device)
        if not warm_up_enabled(cfg.actor.warm_up, compiles=compiles, world_size=self.world_size,
                               memory_managed=self.core.memory.is_managed):  # fmt: skip
            return None
        job: BackgroundJob[float | None] = BackgroundJob(self._warmed_up, name="trainer-warm-up")
        job.submit(self._warm_up)
        return job

    def _warm_up(self) -> float | None:
        """A failed warm-up costs only its time: the first real step builds what it needs, as without one."""
        try:
            return self.core.warm_up()
        except Exception as exc:  # any failure here is the real step's to meet, not the warm-up's
            self.log.warning("trainer warm-up failed; the first step builds its graphs", error=repr(exc)[:500])
            return None

    def _warmed_up(self, seconds: float | None) -> None:
        if seconds is not None:
            self.log.info("trainer warmed up", seconds=round(seconds, 2))

    def _finish_warm_up(self) -> None:
        """The first real chunk waits for the warm-up: the model is the warm-up thread's until it ends."""
        if self.warm_up is not None:
            job, self.warm_up = self.warm_up, None
            job.close()

    def _size_thread_pool(self, step: int, version: int) -> None:
        """``topology.trainer_threads=auto`` on CPU: the cores the other processes left idle, and one thread
        more where trying it gave the shorter version interval (psrl.trainer.threads)."""
        sample = self.cpu.since_last() if self.cpu is not None else None
        if sample is not None and self.cpu is not None:
            current = torch.get_num_threads()
            if self.thread_trials is None or self.thread_trials.num_cores != len(sample.cores):
                self.thread_trials = ThreadTrials(len(sample.cores))  # the launcher re-pinned it: start over
            threads = self.thread_trials.decide(current, version, sample)
            if threads != current:
                others = max(0.0, sample.host_busy_s - sample.own_cpu_s) / max(sample.wall_s, 1e-9)
                self.log.info("trainer threads", threads=threads, others_busy_cores=round(others, 2), version=version)
                torch.set_num_threads(threads)
        if self.rank == 0:
            threads_now = {"perf/trainer_threads": float(torch.get_num_threads())}
            self.publisher.publish(Metrics(step=step, values=threads_now), model_version=version)

    def _catch_up_with_ps(self) -> int:
        """A replacement rank whose checkpoint is older than the version the parameter server committed
        continues from that version's weights (pulled and verified), so it never pushes a version
        again; the coordinator re-sends the buffers its predecessor had not trained."""
        cfg = self.config
        endpoints = [self.boot.endpoint(f"ps-{i}.1") for i in range(cfg.topology.n_ps_shards)]
        puller = make_puller(cfg, endpoints, curve=self.bus.options.curve)
        puller.on_retry = self.report_pull_retry
        try:
            committed = puller.latest_version()
            if committed <= self.core.version:
                return committed
            tensors: dict[str, torch.Tensor] = {}
            puller.pull(committed, lambda name, tensor: tensors.__setitem__(name, tensor.clone()))
        finally:
            puller.close()
        self.log.warning("continuing from the committed version", checkpoint_version=self.core.version,
                         committed=committed)  # fmt: skip
        self.core.adopt_weights(committed, tensors)
        if self.rank == 0:  # the step that produced it may have died before reporting: report it (a repeat is harmless)
            self.publisher.publish(TrainerProgress(step=committed, version=committed, num_samples=0))
        return committed

    def _start_push_thread(self) -> None:
        """Pushes in the background (trainer.background_push) land on a thread that wakes the loop through a
        pipe, so each version's progress is reported as soon as its push committed."""
        self.snapshot = WeightSnapshot(self.staging.cast_to)
        self.background_push: bool | None = None  # decided at the first push, from the weights' size
        self._wake_read_fd, self._wake_write_fd = os.pipe()
        os.set_blocking(self._wake_read_fd, False)
        self.add_input(self._wake_read_fd, self._on_push_landed)
        self.pushes = BackgroundJob(self._report_push, name="weight-push", wake=self._wake_loop)

    def _wake_loop(self) -> None:
        os.write(self._wake_write_fd, b"\0")

    def _on_push_landed(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_read_fd, 4096)
        if self.pushes is not None:
            self.pushes.reap()  # a failed push raises here and ends the actor, as a failed blocking push does

    def perform_other(self, effect: Effect) -> None:
        if not isinstance(effect, PushWeights):
            super().perform_other(effect)
            return
        weights = dict(self.core.named_weights())  # a collective under FSDP2: every rank iterates
        in_background = False
        if self.pusher is not None and self.pushes is not None:
            waited = time.monotonic()
            self.pushes.wait()  # the previous version lands first: versions commit in order
            waited_s = time.monotonic() - waited
            in_background = self._pushes_in_background(weights)
            if in_background:
                self._push_snapshot(effect, weights, waited_s)
            else:
                self._report_push(_Pushed(effect, self.pusher.push_weights(effect.version, weights, self.staging)),
                                  progress=False)  # fmt: skip
        self._maybe_checkpoint(effect.version)
        self._size_thread_pool(effect.step, effect.version)
        if not in_background:
            self._publish_progress(effect)

    def _push_snapshot(self, effect: PushWeights, weights: dict[str, torch.Tensor], waited_s: float) -> None:
        """Copy the weights as pushed (queued on the trainer's stream) and push that copy from the push thread."""
        pusher, staging, pushes = self.pusher, self.staging, self.pushes
        assert pusher is not None and pushes is not None
        taken, ready = self.snapshot.take(weights), self.snapshot.ready

        def push() -> _Pushed:
            return _Pushed(effect, pusher.push_weights(effect.version, taken, staging, after=ready), waited_s)

        pushes.submit(push)

    def _pushes_in_background(self, weights: dict[str, torch.Tensor]) -> bool:
        if self.background_push is None:
            device = next(iter(weights.values())).device if weights else torch.device("cpu")
            nbytes = pushed_num_bytes(weights, self.staging.cast_to)
            total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
            cfg = self.config
            self.background_push = cfg.trainer.background_push_on(
                device.type, colocate=cfg.topology.colocate, snapshot_bytes=nbytes, device_bytes=total
            )
            self.log.info("weight pushes", background=self.background_push, snapshot_mb=round(nbytes / 2**20, 1))
        return self.background_push

    def _report_push(self, pushed: _Pushed, *, progress: bool = True) -> None:
        effect, result = pushed.effect, pushed.result
        self.publisher.publish(
            WeightsPushed(version=effect.version, rank=self.rank, num_bytes=result.num_bytes),
            model_version=effect.version,
        )
        timings = {
            "sync/push_s": result.total_s,
            "sync/serialize_s": result.serialize_s,
            "sync/transfer_s": result.transfer_s,
            "sync/commit_s": result.commit_s,
        }
        if pushed.waited_s is not None:  # the step waited this long for the previous version's push
            timings["sync/push_wait_s"] = pushed.waited_s
        self.publisher.publish(Metrics(step=effect.step, values=timings), model_version=effect.version)
        if progress:
            self._publish_progress(effect)

    def _publish_progress(self, effect: PushWeights) -> None:
        progress = TrainerProgress(
            step=effect.step,
            version=effect.version,
            num_samples=effect.num_samples,
            step_s=time.monotonic() - effect.started_s,
        )
        self.publisher.publish(progress, model_version=effect.version)

    def _maybe_checkpoint(self, version: int) -> None:
        self.writer.reap()
        freq, total = self.config.trainer.save_freq, self.config.trainer.total_steps
        if version >= total:
            self._checkpoint()
        elif freq and version % freq == 0:
            self._checkpoint(background=self.config.trainer.background_save)

    def _checkpoint(self, *, background: bool = False) -> None:
        """Save the current version; `background`: snapshot now, write on the writer thread."""
        if self.checkpoints is None:
            return
        keep, version = self.config.trainer.keep_checkpoints, self.core.version
        if not background:
            self.writer.wait()  # an older write in flight lands first (pruning stays in version order)
            self._written(self.core.save_checkpoint(self.checkpoints, keep=keep))
            return
        snapshot, root = self.core.snapshot_checkpoint(), self.checkpoints
        if self.rank == 0:
            self.writer.submit(lambda: self.core.write_checkpoint(root, snapshot, keep=keep))
        self.saved_version = version  # a stop waits for the write (teardown), so it need not save again

    def _written(self, path: Path) -> None:
        self.saved_version = max(self.saved_version, version_of(path))
        self.log.info("checkpoint", path=str(path), version=self.saved_version)

    def _land_last_push(self) -> None:
        """A push in flight commits (and its progress is reported) before the process ends."""
        pushes = getattr(self, "pushes", None)
        if pushes is None:
            return
        try:
            pushes.close()
        except Exception as exc:  # the run is ending: the version is lost, the checkpoint keeps it
            self.log.error("the last push failed", error=repr(exc))
        finally:
            self.remove_input(self._wake_read_fd)
            os.close(self._wake_read_fd)
            os.close(self._wake_write_fd)

    def _checkpoint_on_stop(self) -> None:
        """A run stopped early keeps every version trained so far (a half-trained buffer is retrained)."""
        if not hasattr(self, "core") or self.state == ActorState.DEAD:
            return
        writer = getattr(self, "writer", None)
        if writer is not None and writer.busy:  # the launcher waits for a background write as for a save on stop
            self.set_state(ActorState.DRAINING, CHECKPOINT_ON_STOP)
            writer.wait()
        if self.core.version <= self.saved_version:
            return
        if not self.core.discard_partial_buffer():
            self.log.warning("no checkpoint on stop: a pre_step buffer is half-applied", version=self.core.version)
            return
        self.log.info("checkpoint on stop", reason=self.stop_reason, version=self.core.version)
        # tells the launcher to wait for the save (up to trainer.stop_save_timeout_s) before terminating
        self.set_state(ActorState.DRAINING, CHECKPOINT_ON_STOP)
        self._checkpoint()

    def teardown(self) -> None:
        try:
            if getattr(self, "warm_up", None) is not None:
                self._finish_warm_up()  # the weights are the warm-up thread's until it ends
            self._checkpoint_on_stop()
        finally:
            self._land_last_push()
            if hasattr(self, "writer"):
                self.writer.close()  # a background write in flight lands before the process ends
        super().teardown()
        if getattr(self, "pusher", None) is not None:
            self.pusher.close()  # type: ignore[union-attr]
        if hasattr(self, "parallel"):
            self.parallel.close()
