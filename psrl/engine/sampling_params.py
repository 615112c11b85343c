"""Per-request sampling parameters, validated so a bad request fails alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psrl.errors import RequestError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one request.

    `temperature` 0 means greedy. Log-probabilities are reported under the temperature-scaled
    distribution before top-k / top-p truncation (what a trainer recomputes with the same
    temperature); greedy requests report them under temperature 1. `min_tokens` suppresses
    end-of-sequence and stop tokens until that many tokens exist; `ignore_eos` never stops on
    end-of-sequence (stop_token_ids still apply). `num_logprobs` > 0 also returns that many
    most likely (token, logprob) pairs per position.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    num_logprobs: int = 0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_truncation(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    @classmethod
    def from_mapping(cls, request_id: str, values: Mapping[str, Any]) -> SamplingParams:
        """Build from a wire dict; unknown fields and bad values raise a request-scoped error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise RequestError(request_id, f"unknown sampling field(s) {unknown}; known: {sorted(known)}")
        kwargs = dict(values)
        if "stop_token_ids" in kwargs:
            kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
        try:
            params = cls(**kwargs)
        except TypeError as error:
            raise RequestError(request_id, f"bad sampling parameters: {error}") from error
        params.validate(request_id)
        return params

    def validate(self, request_id: str) -> None:
        """Raise RequestError naming the first field that is out of range."""
        problem = _first_problem(self)
        if problem is not None:
            raise RequestError(request_id, problem)


def _first_problem(params: SamplingParams) -> str | None:
    checks: list[tuple[bool, str]] = [
        (_is_int(params.max_tokens) and params.max_tokens > 0, f"max_tokens must be > 0, got {params.max_tokens}"),
        (
            _is_number(params.temperature) and params.temperature >= 0,
            f"temperature must be >= 0, got {params.temperature}",
        ),
        (_is_number(params.top_p) and 0 < params.top_p <= 1, f"top_p must be in (0, 1], got {params.top_p}"),
        (
            _is_int(params.top_k) and (params.top_k == -1 or params.top_k > 0),
            f"top_k must be -1 or > 0, got {params.top_k}",
        ),
        (_is_int(params.min_tokens) and params.min_tokens >= 0, f"min_tokens must be >= 0, got {params.min_tokens}"),
        (all(_is_int(t) and t >= 0 for t in params.stop_token_ids), "stop_token_ids must be non-negative ints"),
        (isinstance(params.ignore_eos, bool), f"ignore_eos must be a bool, got {params.ignore_eos!r}"),
        (params.seed is None or _is_int(params.seed), f"seed must be an int or None, got {params.seed!r}"),
        (_is_int(params.num_logprobs) and 0 <= params.num_logprobs <= 64, "num_logprobs must be in [0, 64]"),
    ]
    return next((message for is_ok, message in checks if not is_ok), None)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
