"""The task interface: a seeded prompt source and a verifiable reward.

A task is addressed by prompt index: `prompt(index)` is a pure function of (task seed, index), so
the coordinator's dataset cursor is just an int and a replay regenerates the same prompts.
Prompts and rewards are plain data (str, int, float), so they cross the bus as msgpack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Prompt:
    index: int
    kind: str  # sub-task name, for per-kind metrics
    text: str  # what the policy sees
    answer: str  # the reference the reward compares against
    # the prompt already tokenized (a dataset renders chat templates itself); empty = tokenize `text`
    token_ids: tuple[int, ...] = ()
    row: dict[str, Any] = field(default_factory=dict)  # a dataset row's columns, for the reward function

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Prompt:
        return cls(index=int(values["index"]), kind=str(values["kind"]), text=str(values["text"]),
                   answer=str(values["answer"]), token_ids=tuple(int(t) for t in values.get("token_ids", ())),
                   row=dict(values.get("row", {})))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Reward:
    score: float  # in [0, 1], partial credit
    acc: float  # 1.0 for an exactly correct answer, else 0.0


class Task(Protocol):
    @property
    def name(self) -> str: ...

    def prompt(self, index: int) -> Prompt:
        """The index-th prompt; the same (seed, index) always gives the same prompt."""
        ...

    def reward(self, prompt: Prompt, response: str) -> Reward:
        """Score a decoded response (text after the prompt, end-of-sequence token removed)."""
        ...
