"""The branch rule of a training run's gateway session: an edited history cuts the trajectory back (pure).

A run's session is one router trajectory: the row's prompt (the prompt group's, shared by its
children) and a response that grows turn by turn. When the agent's call does not continue the
session's last turn (it dropped its last reply, truncated or summarised its history, edited a
message), TITO places it on the longest history it still starts with; the call's prompt
(``Plan.prompt``: exact tokens) then shares a prefix with the session's current tokens. The next
turn is sent as a **cut**: the trajectory is cut back to that longest common token prefix (``keep``
tokens; where the loss masks agree too) and the rest of the call's prompt is appended as the
observation (untrained: loss mask 0, log-prob 0), so the trajectory that reaches the trainer is the
branch, byte for byte the engine's tokens. The abandoned tail is dropped from training and recorded
in the event log (``TurnNext``'s ``cut_to``, ``prompt_keep`` and ``num_cut``).

* ``keep`` at or past the session's prompt: the response is cut to ``cut_to = keep - prompt_len``
  tokens (its tokens, log-probs, versions and loss mask alike).
* ``keep`` inside the prompt (a changed system prompt, an edited first message, a dropped first
  reply: the first call's prompt ends with the template's generation prompt, which the first reply
  does not start with): the prompt is cut to its first ``prompt_keep = keep`` tokens and the whole
  response is dropped (``cut_to`` 0). The trajectory keeps its prompt group: it reaches the trainer
  with that shorter prompt of its own (``TrajectoryDone.prompt_keep``), the rest of the call's
  prompt trained as an observation of it, never as generated tokens.
* ``keep`` 0 (the call shares no token with the session): refused (``BranchRefusedError``), as a
  trajectory needs at least one prompt token to train on.

A cut does not re-pin: the trajectory keeps its ``V_traj`` and its staleness reservation (it is the
same trajectory, its kept tokens were generated under them), and the next turn generates at that
version as any turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class BranchRefusedError(ValueError):
    """The call shares no token with the session: no branch point (a trajectory needs a prompt)."""


CutPoint = tuple[int, int]  # (cut_to, prompt_keep): where a turn's cut leaves the session
NO_CUT: CutPoint = (-1, -1)


@dataclass(frozen=True)
class Cut:
    """The next turn of a session: cut its prompt to ``prompt_keep`` tokens (-1: the prompt stays) and
    its response to ``cut_to`` tokens (-1: no cut), then append ``observation``; ``num_cut`` tokens
    (response and prompt) are dropped."""

    cut_to: int
    observation: list[int]
    num_cut: int = 0
    prompt_keep: int = -1

    @property
    def is_cut(self) -> bool:
        return self.cut_to >= 0

    @property
    def point(self) -> CutPoint:
        return (self.cut_to, self.prompt_keep)


def plan_cut(
    current: Sequence[int],
    current_mask: Sequence[int],
    prompt: Sequence[int],
    prompt_mask: Sequence[int],
    prompt_len: int,
    where: str,
) -> Cut:
    """The turn that generates after ``prompt`` (full tokens) in a session whose tokens are ``current``
    (its ``prompt_len`` prompt tokens, then its response). The kept prefix is the longest whose tokens
    and loss mask (1: generated, 0: prompt and observations) both agree, so what is trained of it is
    what the branch's record says was generated. ``where`` names the session and turn."""
    keep = min(_common(current, prompt), _common(current_mask, prompt_mask))
    if keep == 0:
        raise BranchRefusedError(
            f"{where}: the conversation shares no token with the session (its first token differs), so "
            "it has no branch point: a trajectory needs at least one prompt token to train on"
        )
    observation = list(prompt[keep:])
    if keep == len(current):
        return Cut(-1, observation)
    if keep < prompt_len:  # a branch inside the prompt: the whole response goes too
        return Cut(0, observation, len(current) - keep, prompt_keep=keep)
    return Cut(keep - prompt_len, observation, len(current) - keep)


def cut_response(
    token_ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray, loss_mask: np.ndarray, cut_to: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A response's arrays cut to their first ``cut_to`` tokens, all four alike."""
    if not 0 <= cut_to <= len(token_ids):
        raise ValueError(f"cut_to is {cut_to}; the response has {len(token_ids)} tokens (0 <= cut_to <= that)")
    return token_ids[:cut_to], logprobs[:cut_to], versions[:cut_to], loss_mask[:cut_to]


def cut_prompt(prompt_ids: np.ndarray, prompt_keep: int, cut_to: int) -> np.ndarray:
    """A session's prompt cut to its first ``prompt_keep`` tokens (a branch inside it), which drops the
    whole response (``cut_to`` must be 0: no response token follows a cut prompt)."""
    if not 0 < prompt_keep < len(prompt_ids):
        raise ValueError(
            f"prompt_keep is {prompt_keep}; the prompt has {len(prompt_ids)} tokens (0 < prompt_keep < that)"
        )
    if cut_to != 0:
        raise ValueError(
            f"prompt_keep is {prompt_keep} with cut_to {cut_to}: a cut inside the prompt drops the response"
        )
    return prompt_ids[:prompt_keep]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
