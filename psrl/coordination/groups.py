"""The coordinator's prompt groups: what was dispatched, what came back, what is kept.

A group is one prompt sent as N' requests (``request_id = prompt_id * N' + child``). Results
arrive from the router as trajectories finish; the router says when the group's first N
finished (GroupFinished). Each is taken once: a result or GroupFinished delivered again (by a
restarted router) is ignored, and a GroupFinished that overtook a winner's result waits for it.
Then the group is scored, optionally filtered (zero reward variance
means no learning signal), and either kept (it occupies a staleness slot) or dropped (a fresh
group replaces it). Kept groups wait for their buffer to be consumed. Pure bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import pstdev

import numpy as np

from bus.messages import FinishReason, GroupFinished, TrajectoryDone
from psrl.tasks.base import Prompt, Reward


@dataclass
class PromptGroup:
    prompt_id: int
    prompt: Prompt
    prompt_token_ids: np.ndarray
    results: dict[int, TrajectoryDone] = field(default_factory=dict)
    rewards: dict[int, Reward] = field(default_factory=dict)
    winners: tuple[int, ...] = ()
    buffer: int | None = None
    is_replacement: bool = False
    # the router's GroupFinished was acted on (scored, then kept or filtered): another one for the group
    # is a duplicate (a restarted router delivering again what its predecessor may have delivered)
    is_settled: bool = False
    # a GroupFinished that came before the results of all its winners: acted on when the last arrives
    waiting: GroupFinished | None = None

    def kept_results(self) -> list[tuple[TrajectoryDone, Reward]]:
        return [(self.results[r], self.rewards[r]) for r in self.winners if r in self.results]

    @property
    def has_all_winners(self) -> bool:
        return bool(self.winners) and all(r in self.results for r in self.winners)


class GroupBook:
    def __init__(self, responses_per_prompt: int, first_prompt_id: int = 0) -> None:
        self.n = responses_per_prompt
        self.groups: dict[int, PromptGroup] = {}
        self.num_dispatched = 0  # counted groups (the throttle's count)
        self.num_replacements = 0
        self.next_prompt_id = first_prompt_id

    def open(self, prompt: Prompt, token_ids: np.ndarray, *, is_replacement: bool) -> PromptGroup:
        group = PromptGroup(self.next_prompt_id, prompt, np.asarray(token_ids, np.int32), is_replacement=is_replacement)
        self.groups[group.prompt_id] = group
        self.next_prompt_id += 1
        if is_replacement:
            self.num_replacements += 1
        else:
            self.num_dispatched += 1
        return group

    def request_ids(self, prompt_id: int) -> list[int]:
        return [prompt_id * self.n + child for child in range(self.n)]

    def record(self, result: TrajectoryDone, reward: Reward | None) -> PromptGroup | None:
        group = self.groups.get(result.prompt_id)
        if group is None:
            return None
        group.results[result.request_id] = result
        if reward is not None:
            group.rewards[result.request_id] = reward
        return group

    def complete(self, prompt_id: int, winners: list[int]) -> PromptGroup | None:
        group = self.groups.get(prompt_id)
        if group is not None:
            group.winners = tuple(winners)
        return group

    def drop(self, prompt_id: int) -> PromptGroup | None:
        return self.groups.pop(prompt_id, None)

    def take(self, prompt_ids: list[int]) -> list[PromptGroup]:
        """Hand kept groups over for training (they leave the book)."""
        return [self.groups.pop(p) for p in prompt_ids if p in self.groups]


def has_learning_signal(group: PromptGroup) -> bool:
    """False when every kept response scored the same (GRPO would give them zero advantage)."""
    scores = [reward.score for _, reward in group.kept_results()]
    return len(scores) > 1 and pstdev(scores) > 0


def is_success(result: TrajectoryDone) -> bool:
    """A response to train on: it stopped, hit its length, or was truncated by the proactive filter."""
    return result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TRUNCATED)
