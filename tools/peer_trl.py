"""Pure parts of tools/bench_peer_trl.py: one workload, written as psrl overrides and as TRL's GRPOConfig.

The workload is read from psrl's resolved configuration (the demo preset, or another configuration,
plus the benchmark's overrides), so both sides get the values psrl actually runs with, never a second copy of them.
A *step* is one batch: ``groups`` prompts x ``group_size`` responses, trained as
``groups / mini_batch_groups`` AdamW updates in both systems (TRL: ``steps_per_generation``).
Nothing here imports TRL or starts a process: the settings table and the RESULT arithmetic are tested
without either.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# reward and accuracy of the first and last this-many steps are reported
EDGE_STEPS = 5


@dataclass(frozen=True)
class Workload:
    model_dir: str
    task: str
    task_seed: int
    steps: int  # batches (psrl trainer steps)
    groups: int  # prompts per batch
    group_size: int
    mini_batch_groups: int  # prompts per AdamW update
    max_prompt_length: int
    max_response_length: int
    temperature: float
    top_p: float
    top_k: int  # -1 = off
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    grad_clip: float
    clip_low: float
    clip_high: float
    kl_coef: float
    norm_adv_by_std: bool
    ppo_epochs: int
    loss_agg_mode: str
    gradient_checkpointing: bool
    seed: int
    compute_dtype: str = "float32"  # psrl's actor.compute_dtype on the run's device; TRL's bf16 follows it
    config: str = "demo"  # the psrl configuration (a preset or a YAML file) the workload was read from
    overrides: tuple[str, ...] = ()  # and its overrides: the task is built from both, on either side

    @property
    def updates_per_step(self) -> int:
        return self.groups // self.mini_batch_groups

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Workload:
        return cls(**{**values, "betas": tuple(values["betas"]), "overrides": tuple(values.get("overrides", ()))})


def workload_from_config(
    config: Any, model_dir: str, source: str = "demo", overrides: Sequence[str] = (), device: str = "cpu"
) -> Workload:
    """The workload psrl runs with ``config`` (a resolved ``psrl.config.Config``, read from ``source``
    with ``overrides``) on ``device`` (cpu or cuda)."""
    actor, algo, task = config.actor, config.algorithm, config.task
    return Workload(
        model_dir=model_dir,
        task=task.name,
        task_seed=task.seed,
        steps=config.trainer.total_steps,
        groups=config.psrl.staleness_buffer_entries,
        group_size=config.psrl.rollout_n,
        mini_batch_groups=actor.ppo_mini_batch_size,
        max_prompt_length=task.max_prompt_length,
        max_response_length=task.max_response_length,
        temperature=task.temperature,
        top_p=task.top_p,
        top_k=task.top_k,
        lr=actor.lr,
        betas=(float(actor.betas[0]), float(actor.betas[1])),
        weight_decay=actor.weight_decay,
        grad_clip=actor.grad_clip,
        clip_low=algo.clip_ratio_low,
        clip_high=algo.clip_ratio_high,
        kl_coef=algo.kl_loss_coef,
        norm_adv_by_std=algo.norm_adv_by_std_in_grpo,
        ppo_epochs=actor.ppo_epochs,
        loss_agg_mode=algo.loss_agg_mode,
        gradient_checkpointing=actor.gradient_checkpointing is True,  # auto: psrl recomputes only what would not fit
        seed=config.trainer.seed,
        compute_dtype=actor.compute_dtype_on(device),
        config=source,
        overrides=tuple(overrides),
    )


def trl_config_kwargs(work: Workload, output_dir: str, threads: int, device: str) -> dict[str, Any]:
    """GRPOConfig arguments for the same workload: one generation batch of TRL is one psrl step."""
    per_update = work.mini_batch_groups * work.group_size
    return {
        "output_dir": output_dir,
        "max_steps": work.steps * work.updates_per_step,
        "per_device_train_batch_size": per_update,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": work.updates_per_step,
        "num_generations": work.group_size,
        "num_iterations": work.ppo_epochs,
        "max_completion_length": work.max_response_length,
        "temperature": work.temperature,
        "top_p": work.top_p,
        "top_k": 0 if work.top_k < 0 else work.top_k,
        "learning_rate": work.lr,
        "lr_scheduler_type": "constant",  # TRL's default decays linearly; psrl's rate is constant
        "warmup_steps": 0,
        "optim": "adamw_torch",
        "adam_beta1": work.betas[0],
        "adam_beta2": work.betas[1],
        "weight_decay": work.weight_decay,
        "max_grad_norm": work.grad_clip,
        "epsilon": work.clip_low,
        "epsilon_high": work.clip_high,
        "beta": work.kl_coef,
        "scale_rewards": "group" if work.norm_adv_by_std else "none",
        "loss_type": "dapo",  # token-mean over the update's tokens, as psrl's loss_agg_mode=token-mean
        "shuffle_dataset": False,  # prompts in index order, as psrl's coordinator hands them out
        "seed": work.seed,
        "gradient_checkpointing": work.gradient_checkpointing,  # GRPOConfig's default is on
        "bf16": work.compute_dtype == "bfloat16",  # autocast as psrl's trainer (GRPOConfig's default is on)
        "use_cpu": device == "cpu",
        "dataloader_num_workers": 0,
        "logging_steps": 1,
        "save_strategy": "no",  # the final model is saved once, after training
        "report_to": "none",
        "disable_tqdm": True,
    }


def unmatched_settings(work: Workload, device: str, trl_threads: int = 2) -> list[str]:
    """Settings the two sides cannot share (printed with every result)."""
    rows = [
        "rollout: psrl's engine (paged KV cache, continuous batching) vs TRL's HF generate"
        + (" (TRL without vLLM: vLLM cannot reach this machine)" if device == "cuda" else ""),
        f"processes: psrl's actors in their own processes (1 thread each) vs TRL in one process "
        f"({trl_threads} torch thread{'s' if trl_threads != 1 else ''})",
        "asynchrony: psrl at its defaults overlaps rollout and training (staleness 2); TRL is synchronous only",
        "old log-probs: psrl takes the engine's and corrects with token-level importance sampling "
        "(threshold 2); TRL recomputes them with the training model and has no such correction",
        "sampling streams: psrl seeds each request; TRL draws from torch's global generator (different samples)",
        "checkpoints: psrl (defaults) saves every 10 steps and at the end; TRL saves the final model once",
        "advantages: both (reward - group mean) / (group std + eps), eps 1e-6 in psrl and 1e-4 in TRL",
    ]
    if work.loss_agg_mode != "token-mean":
        rows.append(f"loss aggregation: psrl {work.loss_agg_mode} vs TRL dapo (token-mean)")
    return rows


def median(values: Sequence[float]) -> float:
    """Median of the finite values; nan when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


@dataclass(frozen=True)
class StepTiming:
    first_step_s: float  # command start to the end of the first step
    s_per_step: float  # median interval between consecutive step ends
    # first step's end to the last one's over the steps between: the throughput, which a median of bursty
    # intervals (an asynchronous run's short ones while rollout is ahead, long ones once it is behind) hides
    mean_s_per_step: float = math.nan


def step_timing(start: float, step_ends: Sequence[float]) -> StepTiming:
    """Timing of one run from its start time and the (wall-clock) end time of each step."""
    ends = sorted(step_ends)
    if not ends:
        return StepTiming(math.nan, math.nan)
    intervals = [b - a for a, b in itertools.pairwise(ends)]
    mean = (ends[-1] - ends[0]) / len(intervals) if intervals else math.nan
    return StepTiming(ends[0] - start, median(intervals), mean)


def edge_means(values: Sequence[float], count: int = EDGE_STEPS) -> tuple[float, float]:
    """Mean of the first and of the last ``count`` values (nan when empty)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values[:count]), statistics.fmean(values[-count:])


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 and math.isfinite(denominator) else math.nan


RESULT_KEYS = ("speedup_vs_trl_sync", "speedup_vs_trl_async", "wall_vs_trl", "first_step_s", "acc_psrl", "acc_trl")


def result_values(medians: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The RESULT line's values from per-system medians (keys trl, sync, async; psrl = async, its defaults)."""
    trl, sync, default = medians["trl"], medians["sync"], medians["async"]
    return {
        "speedup_vs_trl_sync": ratio(trl["s_per_step"], sync["s_per_step"]),
        "speedup_vs_trl_async": ratio(trl["s_per_step"], default["s_per_step"]),
        "wall_vs_trl": ratio(default["wall_s"], trl["wall_s"]),
        "first_step_s": default["first_step_s"],
        "acc_psrl": default["acc"],
        "acc_trl": trl["acc"],
        "wall_vs_trl_sync": ratio(sync["wall_s"], trl["wall_s"]),
        "first_step_s_sync": sync["first_step_s"],
        "first_step_s_trl": trl["first_step_s"],
        "acc_psrl_sync": sync["acc"],
        "throughput_vs_trl_sync": ratio(trl["mean_s_per_step"], sync["mean_s_per_step"]),
        "throughput_vs_trl_async": ratio(trl["mean_s_per_step"], default["mean_s_per_step"]),
    }


def format_result(values: Mapping[str, float]) -> str:
    return "RESULT " + " ".join(f"{key}={value:.3f}" for key, value in values.items())


def parse_result(line: str) -> dict[str, float]:
    """The values of a ``RESULT key=value ...`` line."""
    head, _, rest = line.strip().partition(" ")
    if head != "RESULT":
        raise ValueError(f"not a RESULT line: {line!r}")
    return {key: float(value) for key, value in (item.split("=", 1) for item in rest.split())}
