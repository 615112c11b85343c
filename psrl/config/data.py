"""`data.*`, `reward.*` and `logging.*`: a user's own dataset, reward function and experiment tracker."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from psrl.config.base import Section, field, section


class Data(Section):
    train_files: list[str] = field(
        [],
        "Training prompts: .jsonl / .json / .parquet files or local Hugging Face datasets directories "
        "(save_to_disk); empty = the prompt generator named by task.name.",
    )
    val_files: list[str] = field([], "Held-out prompts, same formats as train_files (the validation split).")
    prompt_key: str = field(
        "prompt",
        "Column holding the prompt: a string (used as it is), or a list of chat messages ({role, content}) "
        "rendered with the tokenizer's chat template.",
    )
    answer_key: str = field("answer", "Column holding the reference answer passed to the reward as `answer`.")
    apply_chat_template: bool = field(
        False, "Render string prompts as one user message with the tokenizer's chat template (chat models)."
    )
    system_prompt: str | None = field(None, "With a chat template: a system message put before every prompt.")
    shuffle: bool = field(True, "Visit the training rows in a seeded random order, a new order each epoch.")
    seed: int = field(0, "Seed of the row order.")
    truncation: Literal["left", "right"] = field(
        "left",
        "A prompt longer than task.max_prompt_length loses tokens on this side (left keeps the question's end "
        "and the generation prompt); counted in the data/truncated_prompts metric.",
    )

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class RewardSettings(Section):
    function: str | None = field(
        None,
        "Reward function as path/to/file.py:name or package.module:name (e.g. psrl.rewards.builtin:math_answer), "
        "called with the keyword arguments it names out of prompt, response, prompt_ids, response_ids, answer, "
        "row and the row's columns; returns a float or a dict of floats with a 'score'. Unset = the task's own.",
    )
    kwargs: dict[str, Any] = field({}, "Extra keyword arguments for the reward function (e.g. a regex pattern).")
    timeout_s: float = field(10.0, "A call that takes longer scores reward.error_score and is counted.", gt=0)
    error_score: float = field(0.0, "Score of a sample whose reward call raised, timed out or returned garbage.")
    num_workers: int = field(4, "Threads running reward calls (a timed-out call keeps its thread until it returns).",
                             ge=1)  # fmt: skip
    max_error_fraction: float = field(
        0.5,
        "A step whose reward calls failed (raised, timed out, returned garbage) in more than this fraction counts "
        "against reward.error_patience; 1 = never stop for failing rewards.",
        ge=0,
        le=1,
    )
    error_patience: int = field(
        3,
        "Consecutive steps over reward.max_error_fraction that stop the run (as failed, with a checkpoint: "
        "fix the reward and launch the same run again to resume).",
        ge=1,
    )


def reward_file(spec: str) -> tuple[str, str] | None:
    """(file, function) when a reward.function spec names a Python file, None for a module path."""
    target, sep, name = spec.rpartition(":")
    if sep and (target.endswith(".py") or "/" in target or "\\" in target):
        return target, name
    return None


class Wandb(Section):
    enable: bool = field(False, "Also send metrics to Weights & Biases (wandb extra).")
    project: str = field("psrl", "W&B project.")
    entity: str | None = field(None, "W&B entity (team or user); unset = the account's default.")
    name: str | None = field(None, "W&B run name; unset = the run directory's name.")
    mode: Literal["online", "offline"] = field(
        "offline", "offline writes the W&B run under the run directory (sync later with `wandb sync`)."
    )
    tags: list[str] = field([], "W&B run tags.")


class Logging(Section):
    wandb: Wandb = section(Wandb, "Weights & Biases.")
