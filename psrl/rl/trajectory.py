"""One finished rollout as the trainer receives it.

The wire format belongs to `bus/`; the coordinator/trainer wiring converts bus messages into
`Trajectory` objects, which validate themselves so a malformed sample is refused before it can
reach a tensor. Per-token fields are numpy arrays end to end (views of the received `TrainData`
where they can be, never per-token Python objects); the batch is built from them in numpy.

Log-prob provenance (open question 15 of the design digest, settled): every response token
carries both the engine's log-prob of the sampled token and the weight version that produced it.
Token-level importance sampling needs only the log-prob (it is what the behaviour policy actually
used, even when a partial rollout spans several versions); the per-token version is kept for
exact staleness metrics and replay.

`interrupt_as_prompt` (open question 14, settled for the training side): it only changes how an
interrupted trajectory's continuation is routed (as a new request whose input is prompt + partial
output). The training sample is unchanged: the original prompt, the whole response (partial output
and continuation, all trained, each token with its own engine log-prob and version), and the
trajectory's first version as `version`. The partial output never becomes part of the prompt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from bus.messages import FinishReason
from psrl.errors import RequestError

# per-token field -> its dtype (the wire's: token ids, versions int32; log-probs float32; mask uint8)
TOKEN_FIELDS: dict[str, type[np.generic]] = {
    "prompt_token_ids": np.int32,
    "response_token_ids": np.int32,
    "rollout_log_probs": np.float32,
    "token_versions": np.int32,
    "loss_mask": np.uint8,
}


class InvalidTrajectoryError(RequestError):
    """A trajectory whose fields disagree; it is refused and nothing else is affected."""


def token_array(values: np.ndarray | Sequence[float], dtype: type[np.generic]) -> np.ndarray:
    """A read-only 1-D array of ``values`` (a view when they already are one of ``dtype``)."""
    array = np.asarray(values, dtype).view()
    if array.ndim != 1:
        raise ValueError(f"a per-token field must be 1-D, got shape {array.shape}")
    array.flags.writeable = False
    return array


@dataclass(frozen=True, slots=True, eq=False)
class Trajectory:
    """A prompt, one response to it, and everything the trainer needs about how it was produced.

    Per-token fields are 1-D numpy arrays (`TOKEN_FIELDS` gives their dtypes), read-only; any sequence
    given is stored as one. An empty array means "not returned" (log-probs), "unknown" (versions) or
    "all trained" (loss mask).
    """

    prompt_id: int
    child: int  # index of this response within its prompt group
    prompt_token_ids: np.ndarray
    response_token_ids: np.ndarray
    rollout_log_probs: np.ndarray  # engine log-prob of each response token; empty when not returned
    token_versions: np.ndarray  # weight version of each response token; empty when unknown
    version: int  # V_traj: the version the trajectory was first routed at
    reward: float
    acc: float | None = None  # task accuracy (0/1 or partial) when the task reports one
    finish_reason: FinishReason = FinishReason.STOP
    loss_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # per response token: 1 = trained,
    # 0 = environment/tool token

    def __post_init__(self) -> None:
        try:
            for name, dtype in TOKEN_FIELDS.items():
                object.__setattr__(self, name, token_array(getattr(self, name), dtype))
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidTrajectoryError(f"{self.prompt_id}/{self.child}", f"{name}: {exc}") from exc
        problem = self._first_problem()
        if problem is not None:
            raise InvalidTrajectoryError(f"{self.prompt_id}/{self.child}", problem)

    def _first_problem(self) -> str | None:
        num_tokens = len(self.response_token_ids)
        if not len(self.prompt_token_ids):
            return "empty prompt"
        if self.child < 0 or self.version < 0:
            return f"negative child index or version ({self.child}, {self.version})"
        for name in ("rollout_log_probs", "token_versions", "loss_mask"):
            values = getattr(self, name)
            if len(values) and len(values) != num_tokens:
                return f"{name} has {len(values)} entries for {num_tokens} response tokens"
        if len(self.token_versions) and int(self.token_versions.min()) < self.version:
            return f"a token version is older than V_traj={self.version}"
        log_probs = self.rollout_log_probs
        if len(log_probs) and (not np.isfinite(log_probs).all() or float(log_probs.max()) > 0):
            return "rollout log-probs must be finite and <= 0"
        if len(self.loss_mask) and int(self.loss_mask.max()) > 1:
            return "loss_mask entries must be 0 or 1"
        if not math.isfinite(self.reward) or (self.acc is not None and not math.isfinite(self.acc)):
            return "reward and acc must be finite"
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trajectory):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    def __hash__(self) -> int:
        return hash((self.prompt_id, self.child, self.version, self.response_token_ids.tobytes()))

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_token_ids)

    @property
    def num_trained_tokens(self) -> int:
        return int(self.loss_mask.sum()) if len(self.loss_mask) else len(self.response_token_ids)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return bool(a == b)
