"""The demo task: arithmetic and list manipulation with answers of very different lengths.

Four kinds, chosen uniformly: `add` (sum of two numbers below 1000, answers of 1-4 characters),
and `copy`, `rev`, `sort` of a list of numbers below 100, whose length is skewed towards short
lists but reaches `max_list_len` (answers of a few to about 150 characters with the default 48).
That spread gives rollouts a long tail. The reward gives partial credit (the fraction of answer
positions that are right), so an imperfect policy earns a graded signal; `acc` is exact match.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from psrl.tasks.base import Prompt, Reward

KINDS = ("add", "copy", "rev", "sort")


@dataclass(frozen=True, slots=True)
class DemoTask:
    seed: int = 0
    max_list_len: int = 48
    name: str = "demo"

    def prompt(self, index: int) -> Prompt:
        rng = random.Random(f"demo:{self.seed}:{index}")
        kind = KINDS[rng.randrange(len(KINDS))]
        if kind == "add":
            a, b = rng.randrange(1000), rng.randrange(1000)
            return Prompt(index, kind, f"add {a} {b}=", str(a + b))
        # u**2 skews towards short lists while keeping a tail up to max_list_len
        length = 1 + int((self.max_list_len - 1) * rng.random() ** 2)
        numbers = [rng.randrange(100) for _ in range(length)]
        if kind == "rev":
            result = numbers[::-1]
        elif kind == "sort":
            result = sorted(numbers)
        else:
            result = numbers
        return Prompt(index, kind, f"{kind} {_join(numbers)}=", _join(result))

    def reward(self, prompt: Prompt, response: str) -> Reward:
        answer = response.strip()
        if answer == prompt.answer:
            return Reward(score=1.0, acc=1.0)
        if prompt.kind == "add":
            return Reward(score=_aligned_fraction(list(answer[::-1]), list(prompt.answer[::-1])), acc=0.0)
        return Reward(score=_aligned_fraction(answer.split(), prompt.answer.split()), acc=0.0)


def _join(numbers: list[int]) -> str:
    return " ".join(str(number) for number in numbers)


def _aligned_fraction(predicted: list[str], target: list[str]) -> float:
    """Fraction of positions equal in both, over the longer of the two (extra output costs credit)."""
    longest = max(len(predicted), len(target))
    if longest == 0:
        return 1.0
    return sum(p == t for p, t in zip(predicted, target, strict=False)) / longest
