"""Validation of request inputs: every problem becomes a RequestError scoped to that request."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as SequenceLike
from dataclasses import dataclass
from typing import Any

from psrl.engine.sampling_params import SamplingParams
from psrl.errors import RequestError


@dataclass(frozen=True, slots=True)
class PriorOutputs:
    """Tokens an earlier run of a request already generated, with their logprobs and versions."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]


def check_token_ids(
    request_id: str, field_name: str, token_ids: SequenceLike[int] | None, vocab_size: int, allow_empty: bool
) -> list[int]:
    if token_ids is None or isinstance(token_ids, str | bytes):
        raise RequestError(request_id, f"{field_name} must be a sequence of token ids")
    ids = list(token_ids)
    if not ids:
        if allow_empty:
            return ids
        raise RequestError(request_id, f"{field_name} is empty")
    if not all(isinstance(token, int) and not isinstance(token, bool) for token in ids):
        raise RequestError(request_id, f"{field_name} must hold only ints")
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise RequestError(request_id, f"{field_name} holds token id {bad}, outside the vocabulary [0, {vocab_size})")
    return ids


def check_prior_outputs(
    request_id: str,
    token_ids: SequenceLike[int] | None,
    logprobs: SequenceLike[float] | None,
    versions: SequenceLike[int] | None,
    vocab_size: int,
) -> PriorOutputs:
    ids = check_token_ids(request_id, "prior_output_ids", token_ids or [], vocab_size, allow_empty=True)
    logprob_list = [float(value) for value in logprobs] if logprobs is not None else [0.0] * len(ids)
    version_list = [int(value) for value in versions] if versions is not None else [-1] * len(ids)
    if len(logprob_list) != len(ids) or len(version_list) != len(ids):
        raise RequestError(
            request_id,
            f"prior outputs disagree in length: {len(ids)} tokens, {len(logprob_list)} logprobs, "
            f"{len(version_list)} versions",
        )
    return PriorOutputs(ids, logprob_list, version_list)


def coerce_sampling_params(request_id: str, sampling: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    """Validated parameters from a SamplingParams, a wire mapping, or None (the defaults)."""
    if sampling is None:
        return SamplingParams()
    if isinstance(sampling, SamplingParams):
        sampling.validate(request_id)
        return sampling
    if isinstance(sampling, Mapping):
        return SamplingParams.from_mapping(request_id, sampling)
    raise RequestError(request_id, f"sampling must be SamplingParams or a mapping, got {type(sampling).__name__}")


def check_room(request_id: str, num_prompt: int, prior: PriorOutputs, max_tokens: int, max_model_len: int) -> None:
    """The request must leave room to generate: in the context, and under max_tokens (which counts prior outputs)."""
    num_prior = len(prior.token_ids)
    if num_prompt + num_prior >= max_model_len:
        raise RequestError(request_id, f"{num_prompt} prompt + {num_prior} prior tokens leave "
                           f"no room in the context of {max_model_len} tokens")  # fmt: skip
    if num_prior >= max_tokens:
        raise RequestError(request_id, f"max_tokens={max_tokens} already reached by the prior outputs")
