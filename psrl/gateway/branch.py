"""The branch rule of a training run's gateway session: an edited history cuts the trajectory back (pure).

A run's session is one router trajectory: the row's prompt (the prompt group's, shared by its
children) and a response that grows turn by turn. When the agent's call does not continue the
session's last turn (it dropped its last reply, truncated or summarised its history, edited a
later message), TITO places it on the longest history it still starts with; the call's prompt
(``Plan.prompt``: exact tokens) then shares a prefix with the session's current tokens. The next
turn is sent as a **cut**: the response is cut back to that longest common token prefix (its tokens,
log-probs, versions and loss mask alike; where the masks agree too) and the rest of the call's
prompt is appended as the observation, so the trajectory that reaches the trainer is the branch,
byte for byte the engine's tokens. The abandoned tail is dropped from training and recorded in the
event log (``TurnNext``'s ``cut_to`` and ``num_cut``). A cut does not re-pin: the trajectory keeps
its ``V_traj`` and its staleness reservation (it is the same trajectory, its kept tokens were
generated under them), and the next turn generates at that version as any turn.

The row's prompt cannot be cut: it is the prompt group's. A call whose common prefix ends inside it
(a changed system prompt, an edited first message, a dropped first reply: the prompt ends with the
template's generation prompt) is refused (``BranchRefusedError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class BranchRefusedError(ValueError):
    """The branch point lies inside the row's prompt, which the session cannot cut."""


@dataclass(frozen=True)
class Cut:
    """The next turn of a session: cut its response to ``cut_to`` tokens (-1: no cut), then append
    ``observation``; ``num_cut`` response tokens are dropped."""

    cut_to: int
    observation: list[int]
    num_cut: int = 0

    @property
    def is_cut(self) -> bool:
        return self.cut_to >= 0


def plan_cut(
    current: Sequence[int],
    current_mask: Sequence[int],
    prompt: Sequence[int],
    prompt_mask: Sequence[int],
    prompt_len: int,
    where: str,
) -> Cut:
    """The turn that generates after ``prompt`` (full tokens) in a session whose tokens are ``current``
    (the row's ``prompt_len`` prompt tokens, then its response). The kept prefix is the longest whose
    tokens and loss mask (1: generated, 0: prompt and observations) both agree, so what is trained of it
    is what the branch's record says was generated. ``where`` names the session and turn."""
    keep = min(_common(current, prompt), _common(current_mask, prompt_mask))
    if keep < prompt_len:
        raise BranchRefusedError(
            f"{where}: the conversation shares {keep} tokens with the session, fewer than the row's "
            f"{prompt_len} prompt tokens (a changed system prompt or first message, or a dropped first reply): "
            "the prompt is the prompt group's and a training run cannot branch inside it; keep the row's "
            "messages and the first reply as they are"
        )
    observation = list(prompt[keep:])
    if keep == len(current):
        return Cut(-1, observation)
    return Cut(keep - prompt_len, observation, len(current) - keep)


def cut_response(
    token_ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray, loss_mask: np.ndarray, cut_to: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A response's arrays cut to their first ``cut_to`` tokens, all four alike."""
    if not 0 <= cut_to <= len(token_ids):
        raise ValueError(f"cut_to is {cut_to}; the response has {len(token_ids)} tokens (0 <= cut_to <= that)")
    return token_ids[:cut_to], logprobs[:cut_to], versions[:cut_to], loss_mask[:cut_to]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
