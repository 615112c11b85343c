"""The simulated workload: the run's prompt groups and the long-tail response lengths.

It is the simulated coordinator's prompt source and scorer: prompts are placeholder tokens of
the right length, and there are no rewards (a simulation keeps every group).

Response lengths are ``psrl.coordination.lengths.forced_length`` (the same draw per request id as
the real coordinator makes), capped by the context limit as the engine would cap them. Prompt
lengths are the task's prompts through the model's tokenizer, exactly what the coordinator
sends, or a fixed length (``SimSettings.prompt_tokens``) for runs where tokenizing every prompt
would only cost time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bus.messages import RequestSampling
from psrl.config import Config
from psrl.coordination.lengths import forced_length
from psrl.errors import ConfigError, ConfigProblem
from psrl.tasks.base import Prompt, Reward

_NO_REWARD = Reward(score=0.0, acc=0.0)


class Workload:
    def __init__(self, config: Config, prompt_tokens: int | None, context_limit: int) -> None:
        if config.task.response_lengths != "long_tail":
            raise ConfigError([ConfigProblem(
                ("task.response_lengths",), repr(config.task.response_lengths),
                "the simulator needs lengths it can know in advance",
                "set task.response_lengths=long_tail (tune task.long_tail_median / long_tail_sigma)",
            )])  # fmt: skip
        self.task = config.task
        self.context_limit = context_limit
        self._prompt_tokens: Callable[[int], int] = (
            _task_prompt_tokens(config) if prompt_tokens is None else (lambda _: prompt_tokens)
        )

    def prompt_tokens(self, prompt_id: int) -> int:
        return self._prompt_tokens(prompt_id)

    def response_tokens(self, request_id: int, num_prompt_tokens: int) -> int:
        length = forced_length(self.task, request_id)
        if length is None:  # unreachable: checked in __init__
            raise ValueError("natural lengths cannot be simulated")
        return max(1, min(length, self.context_limit - num_prompt_tokens - 1))

    # the coordinator's ports (psrl.flows.prompts): placeholder tokens of the right lengths, no rewards

    def prompt(self, prompt_id: int) -> Prompt:
        return Prompt(index=prompt_id, kind="sim", text="", answer="")

    def token_ids(self, prompt: Prompt) -> np.ndarray:
        return np.zeros(self.prompt_tokens(prompt.index), np.int32)

    def sampling(self, request_id: int, num_prompt_tokens: int) -> RequestSampling:
        return RequestSampling(max_tokens=self.response_tokens(request_id, num_prompt_tokens), ignore_eos=True)

    def score(self, prompt: Prompt, token_ids: np.ndarray) -> Reward:
        return _NO_REWARD

    def take_metrics(self) -> dict[str, float]:
        return {}

    def take_first_error(self) -> str:
        return ""


def _task_prompt_tokens(config: Config) -> Callable[[int], int]:
    """Prompt length in tokens, as the coordinator encodes the task's prompt text."""
    from transformers import AutoTokenizer

    from psrl.assets import DEMO_MODEL_DIR
    from psrl.flows.task_source import make_task

    tokenizer: Any = AutoTokenizer.from_pretrained(config.model.tokenizer_path or config.model.path or DEMO_MODEL_DIR)
    task = make_task(config, tokenizer)  # the coordinator's own choice of source

    def count(prompt_id: int) -> int:
        return len(tokenizer.encode(task.prompt(prompt_id).text))

    return count


def context_limit(config: Config) -> int:
    """The engine's context limit: the model's positions, the KV capacity and engine.max_model_len."""
    from psrl.assets import DEMO_MODEL_DIR
    from psrl.models import ModelSpec

    spec = ModelSpec.from_dir(config.model.path or DEMO_MODEL_DIR)
    limit = min(spec.max_position_embeddings, config.engine.num_kv_blocks * config.engine.block_size)
    return limit if config.engine.max_model_len is None else min(limit, config.engine.max_model_len)
