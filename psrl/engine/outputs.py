"""What the engine hands back: per-step token deltas, finished results, and status snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from bus.messages import FinishReason
from psrl.engine.sequence import Sequence

TopLogprobs = list[list[tuple[int, float]]]


@dataclass(slots=True)
class RequestOutput:
    """Tokens a request produced in one step (streaming delta); finish_reason is set on its last."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    top_logprobs: TopLogprobs | None = None
    finish_reason: FinishReason | None = None


@dataclass(slots=True)
class RequestResult:
    """Everything a finished or aborted request generated, including outputs it was continued from.

    `versions[i]` is the weight version that produced `output_ids[i]`.
    """

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    top_logprobs: TopLogprobs | None = None
    num_prior_outputs: int = 0
    num_preemptions: int = 0

    @classmethod
    def from_sequence(cls, seq: Sequence, reason: FinishReason) -> RequestResult:
        return cls(
            request_id=seq.request_id,
            prompt_ids=seq.prompt_ids,
            output_ids=seq.output_ids,
            logprobs=list(seq.logprobs),
            versions=list(seq.versions),
            finish_reason=reason,
            top_logprobs=None if seq.top_logprobs is None else list(seq.top_logprobs),
            num_prior_outputs=seq.num_prior_outputs,
            num_preemptions=seq.num_preemptions,
        )


@dataclass(slots=True)
class StepOutput:
    outputs: list[RequestOutput] = field(default_factory=list)
    finished: list[RequestResult] = field(default_factory=list)
    num_computed_tokens: int = 0  # prompt + decode tokens run through the model this step


@dataclass(slots=True)
class EngineStatus:
    """A snapshot for the rollout actor, the coordinator and the router.

    `num_kv_tokens` counts the tokens whose keys/values running sequences hold (what the router's
    cost model calls KV tokens); `request_tokens` maps each unfinished request to
    (prompt tokens, output tokens).
    """

    weight_version: int
    is_paused: bool
    num_running: int
    num_waiting: int
    num_preempted_waiting: int
    num_preemptions_total: int
    num_kv_blocks_used: int
    num_kv_blocks_total: int
    num_kv_tokens: int
    kv_capacity_tokens: int
    tokens_per_s: float
    prefix_hit_rate: float
    num_prefix_hit_tokens: int
    num_prefix_queried_tokens: int
    num_generated_tokens_total: int
    max_model_len: int
    request_tokens: dict[str, tuple[int, int]] = field(default_factory=dict)
    # offload tier (psrl.lmcache): prefix tokens loaded from it instead of recomputed, blocks copied to it
    num_tier_loaded_tokens: int = 0
    num_tier_offloaded_blocks: int = 0

    @property
    def kv_usage(self) -> float:
        return self.num_kv_blocks_used / self.num_kv_blocks_total if self.num_kv_blocks_total else 0.0


class WaitingQueue(NamedTuple):
    """The engine's waiting queue, as the preemption loopback rule reads it."""

    num_waiting: int
    preempted_request_ids: list[str]  # waiting because the engine preempted them (they hold no KV now)
