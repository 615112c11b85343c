"""One request as the vLLM backend tracks it, and its translation into vLLM's sampling parameters.

vLLM sees a continued request as a longer prompt (prompt + prior outputs) with the remaining
token budget; this side keeps the prompt, every output token with its log-prob and weight version,
so an abort returns exactly what was generated, prior outputs included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bus.messages import FinishReason
from psrl.engine.outputs import RequestResult, TopLogprobs
from psrl.engine.request_checks import PriorOutputs
from psrl.engine.sampling_params import SamplingParams

FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}  # anything else: ABORT


def vllm_sampling_kwargs(params: SamplingParams, num_prior: int, eos_token_ids: tuple[int, ...]) -> dict[str, Any]:
    """vLLM `SamplingParams` fields with psrl's meaning.

    End-of-sequence is passed as stop tokens (vLLM runs without a tokenizer, so it knows no EOS of
    its own); min_tokens and max_tokens count prior outputs, as in the embedded engine.
    """
    stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    return {
        "max_tokens": params.max_tokens - num_prior,
        "min_tokens": max(0, params.min_tokens - num_prior),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else 0,
        "seed": params.seed,
        "stop_token_ids": sorted(stop),
        "ignore_eos": True,
        "logprobs": params.num_logprobs,  # 0: the sampled token's log-prob only
        "detokenize": False,
    }


@dataclass
class TrackedRequest:
    request_id: str
    internal_id: str  # vLLM's own id for it (the external id plus a random suffix)
    prompt_ids: list[int]
    num_logprobs: int
    prior: PriorOutputs
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: TopLogprobs | None = None
    sampling: SamplingParams | None = None  # kept to re-add the request under a new LoRA adapter version

    def __post_init__(self) -> None:
        self.output_ids = list(self.prior.token_ids)
        self.logprobs = list(self.prior.logprobs)
        self.versions = list(self.prior.versions)
        self.top_logprobs = [] if self.num_logprobs > 0 else None

    def extend(self, token_ids: list[int], position_logprobs: list[Any], version: int) -> TopLogprobs | None:
        """Append one step's tokens; `position_logprobs` is vLLM's {token: Logprob} per new token."""
        self.output_ids += token_ids
        self.versions += [version] * len(token_ids)
        self.logprobs += [ranked[token].logprob for token, ranked in zip(token_ids, position_logprobs, strict=True)]
        if self.top_logprobs is None:
            return None
        top = [_top_k(ranked, self.num_logprobs) for ranked in position_logprobs]
        self.top_logprobs += top
        return top

    def result(self, reason: FinishReason, num_preemptions: int = 0) -> RequestResult:
        return RequestResult(
            request_id=self.request_id,
            prompt_ids=self.prompt_ids,
            output_ids=list(self.output_ids),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            finish_reason=reason,
            top_logprobs=None if self.top_logprobs is None else list(self.top_logprobs),
            num_prior_outputs=len(self.prior.token_ids),
            num_preemptions=num_preemptions,
        )


def _top_k(ranked: dict[int, Any], k: int) -> list[tuple[int, float]]:
    # vLLM returns the top k plus the sampled token (rank > k when it is not among them)
    best = sorted((entry.rank, token, entry.logprob) for token, entry in ranked.items() if entry.rank <= k)
    return [(token, logprob) for _, token, logprob in best]
