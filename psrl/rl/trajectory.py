"""One finished rollout as the trainer receives it.

The wire format belongs to `bus/`; the coordinator/trainer wiring converts bus messages into
`Trajectory` objects, which validate themselves so a malformed sample is refused before it can
reach a tensor.

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
from dataclasses import dataclass

from bus.messages import FinishReason
from psrl.errors import RequestError


class InvalidTrajectoryError(RequestError):
    """A trajectory whose fields disagree; it is refused and nothing else is affected."""


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A prompt, one response to it, and everything the trainer needs about how it was produced."""

    prompt_id: int
    child: int  # index of this response within its prompt group
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    rollout_log_probs: tuple[float, ...]  # engine log-prob of each response token; () when not returned
    token_versions: tuple[int, ...]  # weight version of each response token; () when unknown
    version: int  # V_traj: the version the trajectory was first routed at
    reward: float
    acc: float | None = None  # task accuracy (0/1 or partial) when the task reports one
    finish_reason: FinishReason = FinishReason.STOP
    loss_mask: tuple[int, ...] = ()  # per response token: 1 = trained, 0 = environment/tool token; () = all 1

    def __post_init__(self) -> None:
        problem = self._first_problem()
        if problem is not None:
            raise InvalidTrajectoryError(f"{self.prompt_id}/{self.child}", problem)

    def _first_problem(self) -> str | None:
        num_tokens = len(self.response_token_ids)
        if not self.prompt_token_ids:
            return "empty prompt"
        if self.child < 0 or self.version < 0:
            return f"negative child index or version ({self.child}, {self.version})"
        for name, values in (
            ("rollout_log_probs", self.rollout_log_probs),
            ("token_versions", self.token_versions),
            ("loss_mask", self.loss_mask),
        ):
            if values and len(values) != num_tokens:
                return f"{name} has {len(values)} entries for {num_tokens} response tokens"
        if self.token_versions and min(self.token_versions) < self.version:
            return f"a token version is older than V_traj={self.version}"
        log_probs = self.rollout_log_probs
        if log_probs and (not all(map(math.isfinite, log_probs)) or max(log_probs) > 0):
            return "rollout log-probs must be finite and <= 0"
        if not set(self.loss_mask) <= {0, 1}:
            return "loss_mask entries must be 0 or 1"
        if not math.isfinite(self.reward) or (self.acc is not None and not math.isfinite(self.acc)):
            return "reward and acc must be finite"
        return None

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_token_ids)

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask) if self.loss_mask else len(self.response_token_ids)
