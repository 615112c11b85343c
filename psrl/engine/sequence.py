"""Per-request state: tokens, their log-probabilities and weight versions, KV bookkeeping."""

from __future__ import annotations

from enum import IntEnum

import torch

from bus.messages import FinishReason  # the engine ends requests with STOP, LENGTH or ABORT
from psrl.engine.sampling_params import SamplingParams


class SequenceStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


class Sequence:
    """One request inside the engine.

    `token_ids` holds the prompt followed by every output token, including outputs carried over
    from an earlier run of the same request (continuation); `logprobs` and `versions` hold one
    entry per output token. `num_computed_tokens` counts tokens whose keys/values are in the cache.
    """

    __slots__ = (
        "arrival_index",
        "block_table",
        "cache_epoch",
        "finish_reason",
        "generator",
        "kv_arriving",
        "logprobs",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_hashed_blocks",
        "num_preemptions",
        "num_prior_outputs",
        "num_prompt_tokens",
        "params",
        "request_id",
        "sampling_seed",
        "status",
        "token_ids",
        "top_logprobs",
        "versions",
    )

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        arrival_index: int,
        *,
        prior_output_ids: list[int] | None = None,
        prior_logprobs: list[float] | None = None,
        prior_versions: list[int] | None = None,
        generator: torch.Generator | None = None,
        sampling_seed: int = 0,
    ) -> None:
        prior_output_ids = prior_output_ids or []
        self.request_id = request_id
        self.params = params
        self.arrival_index = arrival_index
        self.token_ids: list[int] = prompt_ids + prior_output_ids
        self.num_prompt_tokens = len(prompt_ids)
        self.num_prior_outputs = len(prior_output_ids)
        self.logprobs: list[float] = list(prior_logprobs or [0.0] * len(prior_output_ids))
        self.versions: list[int] = list(prior_versions or [-1] * len(prior_output_ids))
        self.top_logprobs: list[list[tuple[int, float]]] | None = [] if params.num_logprobs > 0 else None
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        self.block_table: list[int] = []
        self.num_hashed_blocks = 0
        # prefix-cache generation the blocks were allocated in; blocks of an older one are never shared
        self.cache_epoch = -1
        # a KV transfer of this sequence's prefix is landing in the offload tier (async mode): prefill
        # in short chunks and take whatever has landed before each
        self.kv_arriving = False
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        # per-request random stream (seeded requests only), so a seed reproduces the same samples
        self.generator = generator
        # 64-bit seed of the device sampler's counter-based draws (psrl.kernels.gpu.triton_sample)
        self.sampling_seed = sampling_seed

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_outputs(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_prefilling(self) -> bool:
        """True until every token except the newest has keys/values in the cache."""
        return self.num_computed_tokens < self.num_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int, logprob: float, version: int) -> None:
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        self.versions.append(version)
