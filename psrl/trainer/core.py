"""The trainer core: consumes staleness buffers (whole, or in chunks as they fill) and produces versions.

The trainer actor wraps one `TrainerCore` per rank and feeds every rank the same trajectories in
the same order; each rank trains on its share (prompt group `g` of a buffer belongs to rank
`g % world_size`). After buffer `v` the weights are version `v + 1`, exposed by `named_weights()`
for the parameter-server push.

Fine-grain overlap (`psrl.fine_grain_overlap`, chunk size from `psrl.config.chunk_plan.plan_chunks`):

* granularity `none`: `train_buffer(v, trajectories)` with the whole buffer.
* `overlap_scope=recompute`: `add_chunk(v, chunk, is_last=...)` as chunks arrive. Each chunk's
  per-sample forwards run at once (in forward units fixed by group order, see `stages.py`); the
  advantage and every optimizer step run once, after the last chunk, on the whole buffer in arrival
  order. Parameters are bit-identical to `none` on the same data.
* `overlap_scope=pre_step`: each chunk is one mini-batch: its forwards (with the weights as they
  are when the chunk is processed), its advantage and one optimizer step. Only the last chunk's
  result is push-ready, so the version advances once per buffer and the push is deferred to it.
  Exact for GRPO (per-group advantages); GAE and REINFORCE++ whiten per chunk (an approximation).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

from psrl.assets import DEMO_MODEL_DIR
from psrl.config import Config
from psrl.config.chunk_plan import plan_chunks
from psrl.config.rules import fusion_blockers, pre_step_needs_mini_batch
from psrl.errors import ConfigError
from psrl.evaluation.certificate import is_by_trajectory, masked_by_trajectory
from psrl.rl.batch import Sample
from psrl.rl.objective import Denominators
from psrl.rl.trajectory import Trajectory
from psrl.tms import TRAINER, SideMemory
from psrl.trainer import checkpoint
from psrl.trainer.checkpoint import Trainable
from psrl.trainer.compiled import compile_enabled, compile_layers
from psrl.trainer.dealing import dealt_mini_batches
from psrl.trainer.forward import compute_precision
from psrl.trainer.lora import LoraSettings
from psrl.trainer.memory import CheckpointPolicy, checkpoint_mode
from psrl.trainer.metrics import MetricSums, buffer_metrics
from psrl.trainer.models import (
    load_critic,
    load_policy,
    load_reference,
    pad_token_id,
    synced_names,
    torch_dtype,
)
from psrl.trainer.optimizer_state import allocate_adam_state
from psrl.trainer.packing import micro_batch_count, plan_packed
from psrl.trainer.parallel import ParallelContext
from psrl.trainer.stages import (
    ForwardModels,
    PendingForward,
    TrainerError,
    advantage_stage,
    finish_forwards,
    run_forwards,
)
from psrl.trainer.update import (
    DeferredPolicyStage,
    UpdateSettings,
    actor_step,
    critic_step,
    denominators,
    token_budget_batches,
)
from psrl.trainer.varlen import use_varlen_attention
from psrl.trainer.warm_up import StepNothing, random_streams_kept, synthetic_buffer, vocab_size_of

ModelT = TypeVar("ModelT", bound=torch.nn.Module)


@dataclass(frozen=True)
class TrainStepResult:
    buffer_id: int
    version: int  # the weights' version after this call
    is_push_ready: bool  # True once per buffer: push `named_weights()` as `version`
    metrics: dict[str, float]
    # (prompt_id, child) -> (mean truncated IS weight, clipped fraction) of this rank's trajectories
    trajectory_is: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    # (prompt_id, child) -> fraction of its trained tokens the rollout correction rejected
    trajectory_masked: dict[tuple[int, int], float] = field(default_factory=dict)


@dataclass
class _TrainingBuffer:
    buffer_id: int
    groups: list[list[Trajectory]] = field(default_factory=list)  # every group, arrival order
    own: list[list[Sample]] = field(default_factory=list)  # this rank's groups
    num_forwarded: int = 0  # own groups whose per-sample stage ran
    num_updated: int = 0  # own groups already trained on (pre_step)
    sums: MetricSums = field(default_factory=MetricSums)
    seconds: float = 0.0
    forward_s: float = 0.0  # no-grad forwards (old/ref log-probs, values)
    update_s: float = 0.0  # forward, backward and optimizer steps
    round: list[list[Trajectory]] = field(default_factory=list)  # groups waiting for a full round of ranks
    num_rounds: int = 0
    rank_tokens: list[int] = field(default_factory=list)  # tokens each rank holds in the current mini-batch


class TrainerCore:
    """Policy (and critic) training on consumed buffers; one instance per data-parallel rank."""

    def __init__(
        self,
        config: Config,
        *,
        model_dir: str | Path | None = None,
        parallel: ParallelContext | None = None,
        memory: SideMemory | None = None,
    ) -> None:
        """`memory` (``psrl.tms``): weights, optimizer state and gradients go to its regions; default resident."""
        _refuse_invalid_overlap(config)
        self.config = config
        self.memory = memory or SideMemory.unmanaged(TRAINER)
        self.parallel = parallel or ParallelContext()
        self.version = 0
        self.next_prompt_id = 0  # one past the highest prompt id trained on: a resumed run's dataset cursor
        self._buffer: _TrainingBuffer | None = None
        # one buffer at a time: a warm-up on its thread and the actor's steps never run the models at once
        self._training = threading.RLock()
        random.seed(config.trainer.seed)
        torch.manual_seed(config.trainer.seed)
        directory = resolve_model_dir(config, model_dir)
        self.assets_dir = Path(config.model.tokenizer_path) if config.model.tokenizer_path else directory
        dtype = torch_dtype(config.actor.dtype)
        device = self.parallel.device
        compute_dtype = torch_dtype(config.actor.compute_dtype_on(device.type))
        checkpointing = checkpoint_mode(config.actor.gradient_checkpointing)
        with self.memory.region("weights"):
            policy = self._prepared(load_policy(directory, dtype, device, LoraSettings.from_config(config.actor.lora)))
            self.checkpointing = {"policy": CheckpointPolicy(policy, checkpointing, compute_dtype)}
            self.policy = self._trainable("policy", policy, config.actor.lora.policy_lr(config.actor.lr))
            self.reference = None
            if config.algorithm.kl_loss_coef > 0:
                self.reference = self._prepared(load_reference(directory, dtype, device))
            self.critic = None
            if config.algorithm.adv_estimator == "gae":
                critic = self._prepared(load_critic(directory, dtype, device))
                self.checkpointing["critic"] = CheckpointPolicy(critic, checkpointing, compute_dtype)
                self.critic = self._trainable("critic", critic, config.critic.lr)
        self.group_size = config.psrl.rollout_n
        self.plan = plan_chunks(
            config.psrl.fine_grain_overlap.granularity,
            config.psrl.fine_grain_overlap.multiplier,
            buffer_groups=config.psrl.staleness_buffer_entries,
            rollout_n=self.group_size,
            ppo_mini_batch_size=config.actor.ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=config.actor.ppo_micro_batch_size_per_gpu,
            dp_size=self.parallel.world_size,
        )
        micro_batch_chunks = config.psrl.fine_grain_overlap.granularity == "micro_batch"
        dynamic_bsz = config.actor.dynamic_bsz_on(device.type, micro_batch_chunks=micro_batch_chunks)
        self.settings = UpdateSettings(
            micro_batch_size=config.actor.ppo_micro_batch_size_per_gpu,
            grad_clip=config.actor.grad_clip,
            temperature=config.task.temperature,
            pad_token_id=pad_token_id(self.policy.raw),  # type: ignore[arg-type]
            max_tokens_per_micro_batch=config.actor.ppo_max_token_len_per_gpu if dynamic_bsz else None,
            compute_dtype=compute_dtype,
            packing=config.actor.packing,
            share_prompts=config.actor.share_prompts_on(device.type),
        )
        self._check_sizes()

    # ---------------------------------------------------------------- public API

    @property
    def is_pre_step(self) -> bool:
        return self.config.psrl.fine_grain_overlap.overlap_scope == "pre_step" and self.plan.effective != "none"

    def train_buffer(self, buffer_id: int, trajectories: Sequence[Trajectory]) -> TrainStepResult:
        """Train on a whole buffer (under pre_step: its mini-batch chunks one after the other)."""
        if not self.is_pre_step:
            result = self.add_chunk(buffer_id, trajectories, is_last=True)
        else:
            groups = group_trajectories(trajectories, self.group_size)
            size = self.plan.chunk_groups
            chunks = [groups[i : i + size] for i in range(0, len(groups), size)]
            if not chunks:
                raise TrainerError(f"buffer {buffer_id} is empty")
            for index, chunk in enumerate(chunks):
                result = self.add_chunk(buffer_id, [t for g in chunk for t in g], is_last=index == len(chunks) - 1)
        if result is None:  # unreachable: the last chunk always returns
            raise TrainerError(f"buffer {buffer_id} produced no result")
        return result

    def add_chunk(self, buffer_id: int, trajectories: Sequence[Trajectory], *, is_last: bool) -> TrainStepResult | None:
        """Feed the next chunk of buffer `buffer_id` (every rank, same data). Returns a result when
        an optimizer step happened (every pre_step chunk, and the last chunk), else None."""
        if self.memory.is_paused:
            raise TrainerError("a training step while the trainer's GPU memory is released (psrl.tms)")
        with self._training, self.memory.region("grads"):  # grads and activations: released without a copy if paused
            return self._add_chunk(buffer_id, trajectories, is_last=is_last)

    def _add_chunk(
        self, buffer_id: int, trajectories: Sequence[Trajectory], *, is_last: bool
    ) -> TrainStepResult | None:
        started = time.perf_counter()
        state = self._state_for(buffer_id)
        new_groups = group_trajectories(trajectories, self.group_size)
        self._add_groups(state, new_groups)
        if self.is_pre_step:
            if len(new_groups) != self.plan.chunk_groups:
                raise TrainerError(
                    f"pre_step trains one mini-batch per chunk: expected {self.plan.chunk_groups} "
                    f"groups, got {len(new_groups)}"
                )
            result: TrainStepResult | None = self._pre_step_chunk(state, len(new_groups), is_last, started)
        else:
            self._forward_units(state, is_final=is_last)
            result = self._finish_buffer(state, started) if is_last else None
        state.seconds += time.perf_counter() - started
        return result

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The policy's weights as (Hugging Face name, full tensor), tied weights once; under LoRA the adapters only.

        Under FSDP2 gathering a tensor is a collective: every rank must iterate to the end."""
        raw = self.policy.raw
        persistent = synced_names(raw)
        for name, tensor in [*raw.named_parameters(), *raw.named_buffers()]:
            if name not in persistent:
                continue
            full = getattr(tensor, "full_tensor", None)
            yield name, (full() if full is not None else tensor).detach()

    @property
    def has_partial_buffer(self) -> bool:
        """A buffer is half-trained (chunks arrived, no version produced yet)."""
        return self._buffer is not None

    def warm_up(self) -> float:
        """Build the compiled graphs on two synthetic buffers of the run's shape (``psrl.trainer.warm_up``);
        nothing the next real buffer sees changes. Returns the seconds it took."""
        with self._training:
            return self._warm_up()

    def _warm_up(self) -> float:
        if self._buffer is not None:
            raise TrainerError("a warm-up between the chunks of a buffer")
        started = time.perf_counter()
        task = self.config.task
        buffers = [
            synthetic_buffer(
                groups=self.config.psrl.staleness_buffer_entries, group_size=self.group_size,
                max_prompt_tokens=task.max_prompt_length, max_response_tokens=task.max_response_length,
                vocab_size=vocab_size_of(self.policy.raw), version=self.version, full_length=full,
            )
            for full in (False, True)
        ]  # fmt: skip
        kept = (self.version, self.next_prompt_id)
        real = [(trainable, trainable.optimizer) for trainable in self._trainables()]
        try:
            with random_streams_kept(self.parallel.device):
                for trainable, optimizer in real:
                    trainable.optimizer = StepNothing(optimizer)  # type: ignore[assignment]
                for buffer in buffers:  # varied lengths, then micro-batches at the token budget
                    self.train_buffer(self.version, buffer)
                    self.version = kept[0]
        finally:
            for trainable, optimizer in real:
                trainable.optimizer = optimizer
                optimizer.zero_grad(set_to_none=True)
            self.version, self.next_prompt_id = kept
            self._buffer = None
        if self.parallel.device.type == "cuda":
            torch.cuda.synchronize(self.parallel.device)
        return time.perf_counter() - started

    def save_checkpoint(self, root: str | Path, *, keep: int = 0) -> Path:
        """Write a resumable checkpoint of the current version (collective under data parallelism)."""
        self._check_between_buffers()
        return checkpoint.save_checkpoint(root, self.version, self._trainables(), self.parallel,
                                          next_prompt_id=self.next_prompt_id, assets_dir=self.assets_dir,
                                          keep=keep, on_device=self._snapshots_on_device())  # fmt: skip

    def snapshot_checkpoint(self) -> checkpoint.CheckpointSnapshot:
        """The current version's checkpoint, off the live tensors (collective under data parallelism): on rank 0,
        which writes it while training goes on, it owns its tensors (on the host, or a copy on the GPU that
        the write moves to the host)."""
        self._check_between_buffers()
        owns = self.parallel.device.type == "cpu" and self.parallel.rank == 0  # a CPU state aliases the live one
        return checkpoint.snapshot_checkpoint(self.version, self._trainables(), self.parallel,
                                              next_prompt_id=self.next_prompt_id, own_copies=owns,
                                              on_device=self._snapshots_on_device())  # fmt: skip

    def _snapshots_on_device(self) -> bool:
        """A CUDA trainer alone on its GPU (one rank, its memory resident) copies the state there when the copy
        fits in half the free memory: milliseconds against seconds to pageable host memory (0.5B: 4.3 GB)."""
        device = self.parallel.device
        if device.type != "cuda" or self.parallel.world_size > 1 or self.memory.is_managed:
            return False
        free, _ = torch.cuda.mem_get_info(device)
        return checkpoint.snapshot_bytes(self._trainables()) <= free // 2

    def write_checkpoint(self, root: str | Path, snapshot: checkpoint.CheckpointSnapshot, *, keep: int = 0) -> Path:
        """Write a snapshot (rank 0's part; safe from another thread: it touches no live tensor)."""
        return checkpoint.write_checkpoint(root, snapshot, assets_dir=self.assets_dir, keep=keep)

    def _check_between_buffers(self) -> None:
        if self._buffer is not None:
            raise TrainerError(f"buffer {self._buffer.buffer_id} is half-trained; checkpoint between buffers")

    def discard_partial_buffer(self) -> bool:
        """Forget a half-trained buffer whose chunks did not change the weights (recompute scope);
        returns whether the weights are still exactly those of `self.version`."""
        if self._buffer is None:
            return True
        if self.is_pre_step and self._buffer.num_updated > 0:
            return False
        self._buffer = None
        return True

    def load_checkpoint(self, path: str | Path) -> int:
        """Resume from `path`: weights, optimizer state, RNG, the version numbering and the dataset cursor."""
        with self.memory.region("optimizer"):  # the loaded optimizer state
            self.version = checkpoint.load_checkpoint(path, self._trainables())
        self.next_prompt_id = int(checkpoint.read_trainer_state(path).get("next_prompt_id", 0))
        self._buffer = None
        return self.version

    def adopt_weights(self, version: int, tensors: Mapping[str, Tensor]) -> None:
        """Continue from ``version``'s published policy weights (a restarted rank whose checkpoint is
        older than what the parameter server already committed): the weights and the version become
        those; the optimizer state (and a critic) stay as loaded, the closest this rank still has."""
        if self._buffer is not None:
            raise TrainerError("cannot adopt weights with a half-trained buffer")
        raw = self.policy.raw
        persistent = synced_names(raw)
        # the names `named_weights` pushes: persistent parameters and buffers, tied weights once
        named = {n: t for n, t in [*raw.named_parameters(), *raw.named_buffers()] if n in persistent}
        missing = sorted(set(named) - set(tensors))
        if missing:
            raise TrainerError(f"version {version} lacks {len(missing)} policy tensors, e.g. {missing[:3]}")
        with torch.no_grad():
            for name, tensor in named.items():
                tensor.copy_(_as_placed_like(tensor, tensors[name]))
        self.version = version

    # ---------------------------------------------------------------- buffer bookkeeping

    def _state_for(self, buffer_id: int) -> _TrainingBuffer:
        if self._buffer is None:
            if buffer_id != self.version:
                raise TrainerError(
                    f"the trainer at version {self.version} consumes buffer {self.version}, got {buffer_id}"
                )
            self._buffer = _TrainingBuffer(buffer_id)
        elif self._buffer.buffer_id != buffer_id:
            raise TrainerError(f"buffer {self._buffer.buffer_id} is unfinished; got a chunk of buffer {buffer_id}")
        return self._buffer

    def _add_groups(self, state: _TrainingBuffer, groups: list[list[Trajectory]]) -> None:
        """Record the groups and take this rank's share, one group of every round of `world_size`
        (see `round_owners`): ownership depends only on the groups' order, never on the chunking."""
        world = self.parallel.world_size
        rounds_per_mini = max(1, self.config.actor.ppo_mini_batch_size // world)
        for group in groups:
            state.groups.append(group)
            state.round.append(group)
            if len(state.round) < world:
                continue
            if state.num_rounds % rounds_per_mini == 0:  # a new mini-batch: its ranks start even
                state.rank_tokens = [0] * world
            owners = round_owners([group_tokens(g) for g in state.round], state.rank_tokens)
            state.own.append([Sample(t) for t in state.round[owners.index(self.parallel.rank)]])
            state.round = []
            state.num_rounds += 1

    def _forward_units(self, state: _TrainingBuffer, *, is_final: bool) -> None:
        """The per-sample stage of every complete forward unit: all forwards launched, then read back."""
        unit = self._forward_unit_groups()
        started = time.perf_counter()
        pending: list[PendingForward] = []
        while state.num_forwarded < len(state.own):
            available = len(state.own) - state.num_forwarded
            if available < unit and not is_final:
                break
            groups = state.own[state.num_forwarded : state.num_forwarded + unit]
            # the first mini-batch's groups (a fixed count, whatever the chunking) leave the policy to the update
            deferred = min(len(groups), max(0, self.deferred_groups - state.num_forwarded))
            with compute_precision(self.parallel.device, self.settings.compute_dtype), self._no_checkpointing():
                pending += self._launch_unit([s for g in groups[:deferred] for s in g], with_policy=False)
                pending += self._launch_unit([s for g in groups[deferred:] for s in g], with_policy=True)
            state.num_forwarded += len(groups)
        for launched in pending:
            finish_forwards(launched, self.config.algorithm, sums=state.sums, buffer_id=state.buffer_id,
                            max_staleness=self.config.psrl.staleness)  # fmt: skip
        if pending:
            state.forward_s += time.perf_counter() - started

    def _forward_unit_groups(self) -> int:
        """Groups per no-grad forward unit: a micro-batch's worth, or under token-budgeted micro-batches a
        rank's share of a mini-batch (the budget then splits it; a group a launch leaves the GPU idle)."""
        if self.settings.max_tokens_per_micro_batch is not None:
            return max(1, self.config.actor.ppo_mini_batch_size // self.parallel.world_size)
        return max(1, self.config.actor.ppo_micro_batch_size_per_gpu // self.group_size)

    def _launch_unit(self, samples: list[Sample], *, with_policy: bool) -> list[PendingForward]:
        """The no-grad forwards of some of a unit's samples; none when nothing is left to run on them."""
        models = self._forward_models()
        if not samples or not (with_policy or models.reference is not None or models.critic is not None):
            return []
        return [self._launch_forwards(part, models, with_policy) for part in self._forward_batches(samples)]

    def _launch_forwards(self, samples: list[Sample], models: ForwardModels, with_policy: bool) -> PendingForward:
        return run_forwards(
            samples,
            models,
            self.config.algorithm,
            temperature=self.settings.temperature,
            pad_token_id=self.settings.pad_token_id,
            parallel=self.parallel,
            packing=self.settings.packing,
            share_prompts=self.settings.share_prompts,
            with_policy=with_policy,
        )

    @property
    def deferred_groups(self) -> int:
        """Own groups of a buffer's first mini-batch whose old log-probs come from their update's forward
        (`actor.fuse_old_log_probs`): the weights are still those of the no-grad forward it replaces. Not
        under several epochs (a group's later passes need them stored first), pre_step (each chunk steps
        on its own forwards) or bypass_mode (the engine's log-probs are the old ones)."""
        actor = self.config.actor
        if actor.fuse_old_log_probs is False or next(fusion_blockers(self.config), None) is not None:
            return 0
        return max(1, actor.ppo_mini_batch_size // self.parallel.world_size)

    def _forward_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """A forward unit's micro-batches: token-balanced when packed (psrl.trainer.packing), else the
        unit as one batch, or token-budgeted length-sorted batches under actor.use_dynamic_bsz."""
        budget = self.settings.max_tokens_per_micro_batch
        if self.settings.packing:
            share = self.settings.share_prompts
            count = micro_batch_count(samples, max_tokens=budget, micro_batch_size=self.settings.micro_batch_size,
                                      share_prompts=share)  # fmt: skip
            return plan_packed(samples, count, max_tokens=budget, share_prompts=share)
        return [samples] if budget is None else token_budget_batches(samples, budget)

    @contextlib.contextmanager
    def _no_checkpointing(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for policy in self.checkpointing.values():
                stack.enter_context(policy.no_grad_forwards())
            yield

    # ---------------------------------------------------------------- updates

    def _finish_buffer(self, state: _TrainingBuffer, started: float) -> TrainStepResult:
        if not state.groups or len(state.groups) % self.parallel.world_size:
            raise TrainerError(f"{len(state.groups)} groups cannot be split over {self.parallel.world_size} ranks")
        own = [s for g in state.own for s in g]
        self._advantages(own, state.sums)
        deferred = DeferredPolicyStage(state.buffer_id, self.config.psrl.staleness)
        for epoch in range(self.config.actor.ppo_epochs):
            for own_part, scale in self._mini_batches(state, epoch):
                self._optimizer_steps(own_part, scale, state.sums, state, deferred)
        return self._complete(state, started)

    def _mini_batches(self, state: _TrainingBuffer, epoch: int) -> Iterator[tuple[list[Sample], Denominators]]:
        """This rank's samples of each optimizer step and the step's denominators (all ranks' samples)."""
        mini, world = self.config.actor.ppo_mini_batch_size, self.parallel.world_size
        if not self.config.actor.shuffle_samples:  # whole groups in arrival order
            for start in range(0, len(state.groups), mini):
                own = [s for g in state.own[start // world :][: mini // world] for s in g]
                yield own, self._denominators([t for g in state.groups[start : start + mini] for t in g])
            return
        seed = self.config.trainer.seed
        parts = dealt_mini_batches(state.own, mini // world, seed=seed, buffer_id=state.buffer_id, epoch=epoch,
                                   rank=self.parallel.rank)  # fmt: skip
        for part in parts:  # every rank deals as many parts of its own samples
            yield part, self._denominators([s.trajectory for s in part], across_ranks=True)

    def _denominators(self, trajectories: Sequence[Trajectory], *, across_ranks: bool = False) -> Denominators:
        """The step's normalisers: of `trajectories`, summed over the ranks when each holds only its own."""
        algorithm = self.config.algorithm
        scale = denominators(trajectories, float(algorithm.loss_scale_factor or self.config.task.max_response_length))
        if not across_ranks or self.parallel.world_size == 1:
            return scale
        counts = torch.tensor([scale.num_tokens, scale.num_seqs], dtype=torch.float64, device=self.parallel.device)
        num_tokens, num_seqs = self.parallel.all_reduce_sum(counts).tolist()
        return replace(scale, num_tokens=num_tokens, num_seqs=num_seqs)

    def _pre_step_chunk(
        self, state: _TrainingBuffer, num_new_groups: int, is_last: bool, started: float
    ) -> TrainStepResult:
        # The chunk's forwards use the weights as they are now, after the earlier chunks' steps.
        self._forward_units(state, is_final=True)
        chunk_own = [s for g in state.own[state.num_updated :] for s in g]
        self._advantages(chunk_own, state.sums)
        everyone = [t for g in state.groups[len(state.groups) - num_new_groups :] for t in g]
        chunk_sums = MetricSums()
        self._optimizer_steps(chunk_own, self._denominators(everyone), chunk_sums, state)
        state.num_updated = len(state.own)
        _merge(state.sums, chunk_sums)
        if is_last:
            return self._complete(state, started)
        return TrainStepResult(state.buffer_id, self.version, False, chunk_sums.reduce(self.parallel))

    def _advantages(self, samples: list[Sample], sums: MetricSums) -> None:
        advantage_stage(samples, self.config.algorithm, pad_token_id=self.settings.pad_token_id,
                        parallel=self.parallel, max_response_length=self.config.task.max_response_length,
                        sums=sums)  # fmt: skip

    def _optimizer_steps(
        self,
        own: list[Sample],
        scale: Denominators,
        sums: MetricSums,
        state: _TrainingBuffer,
        deferred: DeferredPolicyStage | None = None,
    ) -> None:
        started = time.perf_counter()
        actor_step(self.policy, own, scale, self.config.algorithm, self.settings, self.parallel, sums,
                   self.checkpointing["policy"], deferred)  # fmt: skip
        if self.critic is not None:
            critic_step(
                self.critic,
                own,
                scale,
                self.config.algorithm,
                self.settings,
                self.parallel,
                sums,
                clip_range=self.config.critic.cliprange_value,
                vf_coef=self.config.critic.vf_coef,
                checkpointing=self.checkpointing["critic"],
            )
        state.update_s += time.perf_counter() - started

    def _complete(self, state: _TrainingBuffer, started: float) -> TrainStepResult:
        seconds = state.seconds + (time.perf_counter() - started)
        trajectories = [t for g in state.groups for t in g]
        metrics = buffer_metrics(state.buffer_id, trajectories, self.config.psrl.staleness)
        metrics.update(state.sums.reduce(self.parallel))
        num_tokens = sum(len(t.prompt_token_ids) + t.num_response_tokens for t in trajectories)
        metrics["perf/train_seconds"] = seconds
        metrics["perf/forward_s"] = state.forward_s
        metrics["perf/update_s"] = state.update_s
        metrics["perf/tokens_per_s"] = num_tokens / max(seconds, 1e-9)
        self.version += 1
        self.next_prompt_id = max([self.next_prompt_id, *(t.prompt_id + 1 for t in trajectories)])
        metrics["trainer/version"] = float(self.version)
        self._buffer = None
        threshold = self.config.algorithm.rollout_correction.rollout_is_threshold
        own = [s for g in state.own for s in g]
        trajectory_is = is_by_trajectory(own, threshold)
        return TrainStepResult(state.buffer_id, self.version, True, metrics, trajectory_is, masked_by_trajectory(own))

    # ---------------------------------------------------------------- helpers

    def _prepared(self, model: ModelT) -> ModelT:
        """A loaded model set up for this trainer's micro-batches (varlen attention when packed)."""
        if self.config.actor.packing:
            use_varlen_attention(model)
        if compile_enabled(self.config.actor.compile, self.parallel.device):
            compile_layers(model)
        return model

    def _trainable(self, name: str, raw: torch.nn.Module, lr: float) -> Trainable:
        model = self.parallel.wrap(raw, self.config.actor.strategy)
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=lr,
            betas=self.config.actor.betas,
            weight_decay=self.config.actor.weight_decay,
            fused=uses_fused_adam(self.parallel.device),
        )
        if self.memory.is_managed:  # the state in its region now; steps (and their temporaries) outside it
            with self.memory.region("optimizer"):
                allocate_adam_state(optimizer)
        return Trainable(name, model, raw, optimizer)

    def _trainables(self) -> list[Trainable]:
        return [self.policy] + ([self.critic] if self.critic is not None else [])

    def _forward_models(self) -> ForwardModels:
        critic = self.critic.model if self.critic is not None else None
        return ForwardModels(self.policy.model, self.reference, critic)

    def _check_sizes(self) -> None:
        world = self.parallel.world_size
        if self.config.actor.ppo_mini_batch_size % world:
            raise TrainerError(
                f"actor.ppo_mini_batch_size={self.config.actor.ppo_mini_batch_size} prompt groups cannot be split "
                f"evenly over {world} data-parallel ranks"
            )


def group_tokens(group: Sequence[Trajectory]) -> int:
    return sum(len(t.prompt_token_ids) + t.num_response_tokens for t in group)


def round_owners(tokens: Sequence[int], rank_tokens: list[int]) -> list[int]:
    """The rank of each group of one round (one group per rank): the round's largest group goes to the
    rank holding the fewest tokens of the mini-batch so far, the next largest to the next, and so on
    (ties: arrival order, lower rank). `rank_tokens` is updated. Data-parallel ranks balance by token
    count this way while each still holds whole prompt groups, one per round, so a mini-batch of
    `ppo_mini_batch_size` groups gives every rank the same number of groups."""
    by_size = sorted(range(len(tokens)), key=lambda i: (-tokens[i], i))
    by_load = sorted(range(len(rank_tokens)), key=lambda r: (rank_tokens[r], r))
    owners = [0] * len(tokens)
    for group, rank in zip(by_size, by_load, strict=True):
        owners[group] = rank
        rank_tokens[rank] += tokens[group]
    return owners


def uses_fused_adam(device: torch.device) -> bool | None:
    """Fused AdamW (one kernel over all parameters) on CUDA and the CPU (on the CPU torch's default is a loop
    over the parameters: 4x slower on the demo model); elsewhere torch's default."""
    return True if device.type in ("cuda", "cpu") else None


def group_trajectories(trajectories: Sequence[Trajectory], group_size: int) -> list[list[Trajectory]]:
    """Group by prompt id in order of first appearance; every group must have `group_size` members."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.prompt_id, []).append(t)
    wrong = {p: len(g) for p, g in groups.items() if len(g) != group_size}
    if wrong:
        raise TrainerError(f"prompt groups must have {group_size} trajectories; got {wrong}")
    return list(groups.values())


def resolve_model_dir(config: Config, model_dir: str | Path | None) -> Path:
    directory = Path(model_dir or config.model.path or DEMO_MODEL_DIR)
    if not (directory / "config.json").exists():
        raise TrainerError(f"{directory} is not a Hugging Face checkpoint directory (no config.json)")
    return directory


def _refuse_invalid_overlap(config: Config) -> None:
    problems = list(pre_step_needs_mini_batch(config))
    if problems:
        raise ConfigError(problems)


def _merge(total: MetricSums, part: MetricSums) -> None:
    for name, value in part.sums.items():
        total.sums[name] = total.sums.get(name, 0.0) + value
        total.counts[name] = total.counts.get(name, 0.0) + part.counts[name]
    for name, value in part.maxima.items():
        total.add_max(name, value)
    for name, value in part.minima.items():
        total.add_min(name, value)
    total.sparse |= part.sparse
    for name, values in part.pooled.items():
        total.pooled.setdefault(name, []).extend(values)


def _as_placed_like(target: Tensor, full: Tensor) -> Tensor:
    """``full`` laid out as ``target``: under FSDP2 a parameter is this rank's shard of a DTensor, and
    every rank holds the whole published tensor, so each takes its own part without communication."""
    mesh = getattr(target, "device_mesh", None)
    if mesh is None:
        return full
    from torch.distributed.tensor import distribute_tensor

    source = full.to(device=target.device, dtype=target.dtype)
    return distribute_tensor(source, mesh, target.placements, src_data_rank=None)  # type: ignore[attr-defined]
