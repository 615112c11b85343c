"""`algorithm.*`, `actor.*` and `critic.*`: the RL algorithm and the trainer's optimisation."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from psrl.config.base import Section, field, section

Level = Literal["token", "sequence", "geometric"]


class RolloutCorrection(Section):
    rollout_is: Level | None = field(
        None,
        "Importance weights pi_old / pi_rollout against the rollout/trainer mismatch: token (per-token ratio, TIS), "
        "sequence (product of the response's token ratios) or geometric (their geometric mean); null = none.",
    )
    rollout_is_threshold: float = field(2.0, "Upper truncation of the importance weight.", gt=0)
    rollout_is_threshold_lower: float | None = field(
        None, "Lower truncation of the importance weight (unset = no lower bound).", gt=0
    )
    rollout_rs: Level | None = field(
        None,
        "Rejection (masking) of what leaves the band [rollout_rs_threshold_lower, rollout_rs_threshold]: token "
        "(IcePop: each token on its own ratio), sequence (the whole response on the product of its ratios) or "
        "geometric (on their geometric mean); null = none. Masked tokens weigh 0 and stay in the denominators.",
    )
    rollout_rs_threshold: float | None = field(
        None, "Upper bound of the accepted band (required with rollout_rs; IcePop uses 5, sequence MIS 2).", gt=0
    )
    rollout_rs_threshold_lower: float | None = field(
        None, "Lower bound of the accepted band (unset = 1 / rollout_rs_threshold).", gt=0
    )
    rollout_token_veto_threshold: float | None = field(
        None, "Mask the whole response when any token's ratio is below this (e.g. 1e-4); unset = no veto.", gt=0
    )
    bypass_mode: bool = field(
        False,
        "Use the engine log-probs as the old policy instead of recomputing them on the trainer (the PPO ratio "
        "is then pi_theta / pi_rollout and no separate weight or rejection applies).",
    )


class PolicyLoss(Section):
    loss_mode: Literal["ppo", "gspo", "cispo"] = field(
        "ppo",
        "Policy loss: ppo (clipped token ratio), gspo (clipped sequence ratio, the geometric mean of the token "
        "ratios; needs loss_agg_mode=seq-mean-token-mean) or cispo (clipped stop-gradient token ratio times "
        "the log-prob: every token keeps a gradient).",
    )
    clip_ratio_c: float | None = field(
        None,
        "Dual-clip PPO: a negative-advantage token's loss is at most -A * clip_ratio_c (e.g. 3); unset = off.",
        gt=1,
    )
    gspo_clip_ratio_low: float = field(3e-4, "GSPO clip range of the sequence ratio below 1.", gt=0)
    gspo_clip_ratio_high: float = field(4e-4, "GSPO clip range of the sequence ratio above 1.", gt=0)
    cispo_clip_ratio_low: float = field(
        1.0, "CISPO: the weight is clipped below at 1 - this (1 = no lower bound, as in MiniMax-M1).", ge=0, le=1
    )
    cispo_clip_ratio_high: float = field(0.28, "CISPO: the weight is clipped above at 1 + this.", gt=0)


class OverlongBuffer(Section):
    enable: bool = field(False, "DAPO overlong reward shaping: penalise responses that enter the last `len` tokens.")
    len: int = field(
        4, "Tokens before task.max_response_length where the penalty starts (it grows linearly to the end).", ge=1
    )
    penalty_factor: float = field(1.0, "Penalty at task.max_response_length (subtracted from the reward).", ge=0)


class FilterGroups(Section):
    enable: bool = field(False, "Drop prompt groups whose rewards have zero variance (no learning signal).")
    metric: Literal["score", "acc"] = field("score", "Per-trajectory value whose variance is tested.")


class Algorithm(Section):
    adv_estimator: Literal["gae", "grpo", "reinforce_plus_plus", "rloo"] = field(
        "gae", "Advantage estimator (rloo: the reward minus the mean of the group's other rewards)."
    )
    gamma: float = field(1.0, "Discount factor (GAE, REINFORCE++).", ge=0, le=1)
    lam: float = field(1.0, "GAE lambda.", ge=0, le=1)
    norm_adv_by_std_in_grpo: bool = field(True, "GRPO: divide the group-centred reward by the group std.")
    kl_loss_coef: float = field(0.0, "Weight of the KL penalty to the reference policy (0 = no reference model).", ge=0)
    kl_loss_type: Literal["k1", "k2", "low_var_kl"] = field("low_var_kl", "KL estimator.")
    entropy_coeff: float = field(0.0, "Weight of the entropy bonus.", ge=0)
    clip_ratio_low: float = field(0.2, "PPO clip range below 1.", gt=0)
    clip_ratio_high: float = field(0.2, "PPO clip range above 1 (DAPO uses 0.28).", gt=0)
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = (
        field(
            "token-mean",
            "How token losses become the batch loss: mean over tokens, mean over sequences of token means, "
            "mean over sequences of token sums, or (Dr.GRPO) the token sum over sequences / (sequences x "
            "loss_scale_factor), a constant normaliser that does not depend on response lengths.",
        )
    )
    loss_scale_factor: int | None = field(
        None, "The constant of seq-mean-token-sum-norm (unset = task.max_response_length).", ge=1
    )
    policy_loss: PolicyLoss = section(PolicyLoss, "Policy loss and its clipping.")
    overlong_buffer: OverlongBuffer = section(OverlongBuffer, "DAPO overlong reward shaping.")
    rollout_correction: RolloutCorrection = section(RolloutCorrection, "Off-policy correction.")
    filter_groups: FilterGroups = section(FilterGroups, "Dynamic sampling filter.")


# the projections of a Llama-family decoder layer (Llama, Qwen2, Qwen3, Mistral), as Hugging Face names them:
# the only linear layers the trainer wraps and the rollout engines merge
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_LR_SCALE = 10.0  # the adapters' default learning rate over actor.lr


class Lora(Section):
    rank: int = field(
        0,
        "LoRA rank: >0 trains only low-rank adapters (B @ A, rank r) on the target projections, the base frozen; "
        "the parameter server then versions and syncs the adapters only. 0 = full fine-tuning.",
        ge=0,
    )
    alpha: float = field(32.0, "LoRA scale numerator: the update is (alpha / rank) * B @ A.", gt=0)
    lr: float | None = field(
        None,
        "Learning rate of the adapters; unset = 10 x actor.lr (LoRA's best rate is about ten times full "
        "fine-tuning's; see docs/tuning.md).",
        gt=0,
    )
    dropout: float = field(
        0.0, "Dropout on the adapters' input in the trainer's gradient forwards (no-grad log-prob forwards: none).",
        ge=0, lt=1,
    )  # fmt: skip
    target_modules: tuple[str, ...] = field(
        LORA_TARGETS, "Projections given adapters, by Hugging Face module name: any of " + ", ".join(LORA_TARGETS) + "."
    )

    @field_validator("target_modules")
    @classmethod
    def _known_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in LORA_TARGETS]
        if unknown:
            raise ValueError(
                f"{unknown} are not projections of a decoder layer; fix: use names from {list(LORA_TARGETS)}"
            )
        if not value or len(set(value)) != len(value):
            raise ValueError(
                "give at least one name, each once; fix: e.g. [q_proj, v_proj] or the default, every projection"
            )
        return value

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank if self.rank else 0.0

    def policy_lr(self, actor_lr: float) -> float:
        """The policy's learning rate: actor.lr without LoRA; with it ``lr`` when set, else LORA_LR_SCALE x actor.lr."""
        if not self.enabled:
            return actor_lr
        return self.lr if self.lr is not None else LORA_LR_SCALE * actor_lr


class ActorSettings(Section):
    strategy: Literal["fsdp2", "ddp", "megatron"] = field(
        "fsdp2", "Data-parallel strategy of the trainer (megatron is not available in psrl)."
    )
    ppo_epochs: int = field(1, "Passes over each buffer.", ge=1)
    ppo_mini_batch_size: int = field(16, "Prompt groups per optimizer step.", ge=1)
    ppo_micro_batch_size_per_gpu: int = field(4, "Samples per forward/backward per rank.", ge=1)
    use_dynamic_bsz: bool | Literal["auto"] = field(
        "auto",
        "Bound each micro-batch by ppo_max_token_len_per_gpu tokens instead of "
        "ppo_micro_batch_size_per_gpu samples (the step is the same; memory per micro-batch is bounded). "
        "auto: on CUDA with actor.packing, where a few-sample micro-batch leaves the GPU waiting on kernel "
        "launches (a mini-batch of short answers then runs as one forward and backward), unless "
        "psrl.fine_grain_overlap.granularity=micro_batch; off on the CPU.",
    )
    ppo_max_token_len_per_gpu: int = field(
        16384,
        "Tokens per micro-batch with use_dynamic_bsz: real tokens when actor.packing, else padded ones "
        "(rows x longest prompt + response).",
        ge=1,
    )
    lr: float = field(1e-6, "Learning rate.", gt=0)
    weight_decay: float = field(0.0, "AdamW weight decay.", ge=0)
    betas: tuple[float, float] = field((0.9, 0.999), "AdamW betas.")
    grad_clip: float = field(1.0, "Gradient norm clip (0 = off).", ge=0)
    dtype: Literal["float32", "bfloat16"] = field("float32", "Parameter dtype of the trained model.")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = field(
        "auto",
        "dtype of the trainer's forward and backward arithmetic (torch.autocast). bfloat16 keeps parameters, "
        "gradients and optimizer state in actor.dtype (mixed precision) and runs the matmuls at bf16 speed. "
        "auto: bfloat16 on CUDA (as the engine serves there), float32 on CPU (where bf16 arithmetic is no faster).",
    )
    gradient_checkpointing: bool | Literal["auto"] = field(
        "auto",
        "Policy and critic keep only each transformer layer's input for the backward pass and recompute the "
        "rest (activation memory of long responses drops by about the layer count; one more forward per update). "
        "auto: per micro-batch, when its estimated activations exceed 60% of the free device memory, and then "
        "only the fewest layers that bring them under (psrl.trainer.memory).",
    )
    compile: bool | Literal["auto"] = field(
        "auto",
        "torch.compile each transformer layer of the trainer's models (built once, reused by every layer, "
        "dynamic shapes): fuses the norms, rotary embeddings, activations and casts between the matmuls "
        "(psrl.trainer.compiled). auto: on CUDA (1.33-1.35x a real-scale step); off on CPU.",
    )
    warm_up: bool | Literal["auto"] = field(
        "auto",
        "While the rollout makes the first batch, train two synthetic buffers of the run's shape (varied lengths, "
        "then full micro-batches) without stepping the optimizer (weights, optimizer state and random streams "
        "unchanged), so the compiled layers are built before the first real step needs them "
        "(psrl.trainer.warm_up). auto: when actor.compile is on, on one trainer rank, outside colocation.",
    )
    packing: bool = field(
        True,
        "Padding-free micro-batches: whole sequences end to end in one row with varlen attention, balanced by "
        "token count (psrl.trainer.packing); false = padded rows (use_dynamic_bsz then counts padded tokens).",
    )
    share_prompts: bool | Literal["auto"] = field(
        "auto",
        "With actor.packing: the samples of one prompt (a GRPO group) carry it once in a packed micro-batch, each "
        "response attending to that one copy: the same log-probs and gradients with k-1 fewer copies of the prompt "
        "through every layer for k responses (psrl.trainer.packing). auto: on the CPU; off on CUDA, where the "
        "flash varlen kernel has no shared-prompt form yet (true runs those micro-batches through masked SDPA). "
        "A micro-batch whose segments' attention mask would exceed 64M entries (long answers) is packed whole.",
    )
    fuse_old_log_probs: bool | Literal["auto"] = field(
        "auto",
        "A buffer's first mini-batch takes its old log-probs from its own update's forward, detached: the weights "
        "are still those a separate no-grad forward would use, so that forward is skipped (1/k of the policy's "
        "no-grad forwards for k mini-batches a buffer, all of them when a buffer is one mini-batch). auto: "
        "wherever it applies (ppo_epochs=1, no pre_step chunks, no bypass_mode); true: refused where it cannot; "
        "false runs every sample's no-grad forward.",
    )
    shuffle_samples: bool = field(
        False,
        "Deal a buffer's samples into its mini-batches at random (seeded by trainer.seed, the buffer and the "
        "epoch), as TRL's GRPOTrainer does, instead of whole prompt groups in the order they arrived: each "
        "optimizer step then sees answers to most of the buffer's prompts rather than ppo_mini_batch_size of "
        "them; the advantages are still those of whole groups. Costs trainer time: a prompt is shared only by its "
        "answers within one micro-batch (actor.share_prompts), and the first mini-batch's old log-probs take a "
        "forward of their own (actor.fuse_old_log_probs). On the demo (10 seeds) it moved held-out accuracy by "
        "less than the seeds do, at 1.06-1.18x the step (docs/benchmarks.md). Not with pre_step chunks.",
    )
    lora: Lora = section(Lora, "LoRA: train low-rank adapters instead of every weight (rank 0 = off).")

    def share_prompts_on(self, device_type: str) -> bool:
        """``share_prompts`` on a device (only packed micro-batches share: padded rows hold whole sequences)."""
        if not self.packing:
            return False
        return device_type != "cuda" if self.share_prompts == "auto" else self.share_prompts

    def dynamic_bsz_on(self, device_type: str, *, micro_batch_chunks: bool) -> bool:
        """``use_dynamic_bsz`` on a device; ``micro_batch_chunks``: fine-grain overlap's chunks are sized
        in samples (granularity micro_batch), which token-budgeted micro-batches would not match."""
        if self.use_dynamic_bsz == "auto":
            return device_type == "cuda" and self.packing and not micro_batch_chunks
        return self.use_dynamic_bsz

    def compute_dtype_on(self, device_type: str) -> Literal["float32", "bfloat16"]:
        """``compute_dtype`` on a device: auto is bfloat16 on CUDA, where the engine serves in bf16 and the
        tensor cores run bf16 matmuls several times faster than float32; float32 elsewhere."""
        if self.compute_dtype == "auto":
            return "bfloat16" if device_type == "cuda" else "float32"
        return self.compute_dtype


class Critic(Section):
    lr: float = field(1e-5, "Critic learning rate (GAE only).", gt=0)
    cliprange_value: float = field(0.5, "Value clip range.", gt=0)
    vf_coef: float = field(0.5, "Weight of the value loss.", gt=0)


class TrainerLoop(Section):
    total_steps: int = field(20, "Training steps (= versions produced) before the run ends.", ge=1)
    save_freq: int = field(
        10, "Checkpoint every this many steps (0 = only at the end and when the run is stopped early).", ge=0
    )
    keep_checkpoints: int = field(3, "Keep only this many newest checkpoints (0 = keep all).", ge=0)
    background_save: bool = field(
        True,
        "Periodic checkpoints (save_freq) copy the state to host memory and write the files from a background "
        "thread while training goes on (the step pays the copy, not the disk; a CUDA trainer alone on its GPU "
        "copies on the GPU when the copy fits in half the free memory, and the writer moves it to the host "
        "through two small pinned buffers, which leaves the step's GPU work alone); "
        "the final checkpoint and the one on an early stop are written before the trainer reports them. "
        "false = every save blocks.",
    )
    background_push: bool | Literal["auto"] = field(
        "auto",
        "Push each new version to the parameter server from a background thread while the next step trains: "
        "the weights are first copied where they lie (cast to the served dtype) into buffers kept between "
        "versions, so the step pays that copy rather than the push; one push at a time, in version order, its "
        "progress reported as it lands. auto: on a CUDA trainer not sharing its GPU with rollout "
        "(topology.colocate) when the copy takes at most a tenth of the GPU's memory; off on the CPU, where the "
        "push would take cores from the step. false = the trainer waits for every push.",
    )
    stop_save_timeout_s: float = field(
        120.0,
        "When a run is stopped early (Ctrl-C, SIGTERM), how long the launcher waits for the trainer to "
        "checkpoint its current version before terminating it.",
        gt=0,
    )
    resume: bool = field(True, "Resume from the run directory's latest checkpoint when one exists.")
    eval_interval: int = field(
        0,
        "Evaluate on the held-out split (eval.*) every this many versions, at version 0 and at the last "
        "version (0 = never).",
        ge=0,
    )
    seed: int = field(0, "Seed of the trainer's randomness.")

    def background_push_on(self, device_type: str, *, colocate: bool, snapshot_bytes: int, device_bytes: int) -> bool:
        """``background_push`` for a trainer on ``device_type`` whose snapshot of the pushed weights takes
        ``snapshot_bytes`` of a device holding ``device_bytes`` (0 on the CPU)."""
        if self.background_push != "auto":
            return self.background_push
        return device_type == "cuda" and not colocate and 0 < snapshot_bytes <= device_bytes // 10


class Eval(Section):
    num_prompts: int = field(
        64, "Held-out prompts per evaluation (the first ones of data.val_files, or of the task's held-out split).", ge=1
    )
    greedy: bool = field(True, "Answer each prompt once at temperature 0 (eval/acc).")
    k: int = field(4, "Sampled answers per prompt at task.temperature for eval/pass@k (0 = none).", ge=0)
    max_tokens: int | None = field(None, "Longest evaluation response in tokens; unset = task.max_response_length.",
                                   ge=1)  # fmt: skip
    final_timeout_s: float = field(
        120.0, "After the last step, how long the run waits for the evaluation of the last version.", gt=0
    )
