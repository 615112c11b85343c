"""Where the coordinator's prompts come from and how responses are scored: its two ports.

``CoordinatorFlow`` asks a ``PromptSource`` for the prompt of each new group (the dataset
cursor is just the next prompt id), its token ids and each request's sampling settings, and a
``ResponseScorer`` for the reward of each finished response. ``TaskPrompts`` is the real one, over a
task (``psrl.tasks``) and the model's tokenizer; the simulator plugs in its workload.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from bus.messages import RequestSampling
from psrl.config import Config
from psrl.coordination.lengths import forced_length
from psrl.tasks.base import Prompt, Reward


class PromptSource(Protocol):
    def prompt(self, prompt_id: int) -> Prompt:
        """The prompt of group ``prompt_id`` (the same id always gives the same prompt)."""
        ...

    def token_ids(self, prompt: Prompt) -> np.ndarray:
        """The prompt as the model's tokens (int32)."""
        ...

    def sampling(self, request_id: int, num_prompt_tokens: int) -> RequestSampling:
        """How request ``request_id`` (one response of a group) is sampled."""
        ...


class ResponseScorer(Protocol):
    def score(self, prompt: Prompt, token_ids: np.ndarray) -> Reward:
        """The reward of one response (its token ids) to ``prompt``."""
        ...

    def take_metrics(self) -> dict[str, float]:
        """Counters about the prompts and the scoring since the last call (errors, timeouts, truncations)."""
        ...

    def take_first_error(self) -> str:
        """The first failed reward call's error since the last call ('' when none failed)."""
        ...


class TaskPrompts:
    """Prompts of the configured dataset (data.train_files) or task, through the model's tokenizer, scored
    by reward.function or the task's own reward."""

    def __init__(self, config: Config) -> None:
        from transformers import AutoTokenizer

        from psrl.assets import DEMO_MODEL_DIR
        from psrl.flows.task_source import make_task
        from psrl.rewards.factory import make_scorer

        self.settings = config.task
        model_dir = config.model.tokenizer_path or config.model.path or str(DEMO_MODEL_DIR)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        self.task = make_task(config, self.tokenizer)
        self.scorer = make_scorer(config, self.task)
        eos = self.tokenizer.eos_token_id
        self.stop_token_ids = [] if eos is None else [int(eos)]

    def prompt(self, prompt_id: int) -> Prompt:
        return self.task.prompt(prompt_id)

    def token_ids(self, prompt: Prompt) -> np.ndarray:
        return np.asarray(prompt.token_ids or self.tokenizer.encode(prompt.text), np.int32)

    def sampling(self, request_id: int, num_prompt_tokens: int) -> RequestSampling:
        task = self.settings
        length = forced_length(task, request_id)
        return RequestSampling(
            max_tokens=task.max_response_length if length is None else length,
            temperature=task.temperature,
            top_p=task.top_p,
            top_k=task.top_k,
            # a forced length ends only at its length: no stop token, none masked either, so the tokens
            # are samples of the unmodified policy (and the engine keeps its on-device decode rounds)
            stop_token_ids=self.stop_token_ids if length is None else [],
            seed=(task.seed * 1_000_003 + request_id) % (2**31),
            min_tokens=length or 0,
            ignore_eos=length is not None,
        )

    def score(self, prompt: Prompt, token_ids: np.ndarray) -> Reward:
        text = str(self.tokenizer.decode(token_ids.tolist(), skip_special_tokens=True))
        return self.scorer.score(prompt, text, token_ids.tolist())

    def take_metrics(self) -> dict[str, float]:
        return {"data/truncated_prompts": float(getattr(self.task, "num_truncated", 0)), **self.scorer.take_metrics()}

    def take_first_error(self) -> str:
        return self.scorer.take_first_error()

    def held_out(self, config: Config) -> HeldOutPrompts:
        """The held-out split for evaluation: data.val_files, or the task's own held-out prompts."""
        from psrl.data import load_split
        from psrl.rewards.factory import make_scorer

        task = load_split(config.data, "val", self.tokenizer, config.task.max_prompt_length)
        if task is None:
            held_out = getattr(self.task, "held_out", None)
            if held_out is None:
                raise ValueError(f"task {self.task.name!r} has no held-out split; set data.val_files")
            task = held_out()
        return HeldOutPrompts(task, make_scorer(config, task), self.tokenizer, self.stop_token_ids)

    def close(self) -> None:
        self.scorer.close()


class HeldOutPrompts:
    """The held-out prompts and their scorer (its own, so evaluation never counts in training metrics)."""

    def __init__(self, task: Any, scorer: Any, tokenizer: Any, stop_token_ids: list[int]) -> None:
        self.task, self.scorer, self.tokenizer = task, scorer, tokenizer
        self.stop_token_ids = stop_token_ids

    def prompt(self, index: int) -> Prompt:
        return self.task.prompt(index)  # type: ignore[no-any-return]

    def token_ids(self, prompt: Prompt) -> np.ndarray:
        return np.asarray(prompt.token_ids or self.tokenizer.encode(prompt.text), np.int32)

    def score(self, prompt: Prompt, token_ids: np.ndarray) -> Reward:
        text = str(self.tokenizer.decode(token_ids.tolist(), skip_special_tokens=True))
        return self.scorer.score(prompt, text, token_ids.tolist())  # type: ignore[no-any-return]

    def close(self) -> None:
        self.scorer.close()
