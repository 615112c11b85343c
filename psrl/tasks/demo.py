"""The demo task: arithmetic and digit-string manipulation with answers of very different lengths.

Four kinds, chosen uniformly: `add` (sum of two numbers below 1000: answers of 1-4 characters),
and `copy`, `rev`, `sort` of a string of digits whose length is skewed towards short strings but
reaches `max_length` (answers of 1 to `max_length` characters, 128 by default). That spread gives
rollouts a long tail. The reward gives partial credit (the fraction of answer positions that are
right, counted over the longer of answer and response, so rambling on costs credit); `acc` is
exact match. Responses are compared as text after stripping surrounding whitespace.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from psrl.tasks.base import Prompt, Reward

KINDS = ("add", "copy", "rev", "sort")


@dataclass(frozen=True, slots=True)
class DemoTask:
    seed: int = 0
    max_length: int = 128
    # lengths are 1 + (max_length - 1) * u**length_skew with u uniform: 3 = mostly short, 1 = uniform
    length_skew: float = 3.0
    name: str = "demo"

    def prompt(self, index: int) -> Prompt:
        rng = random.Random(f"demo:{self.seed}:{index}")
        kind = KINDS[rng.randrange(len(KINDS))]
        if kind == "add":
            a, b = rng.randrange(1000), rng.randrange(1000)
            return Prompt(index, kind, f"add {a} {b}=", str(a + b))
        length = 1 + int((self.max_length - 1) * rng.random() ** self.length_skew)
        digits = "".join(str(rng.randrange(10)) for _ in range(length))
        answer = {"copy": digits, "rev": digits[::-1], "sort": "".join(sorted(digits))}[kind]
        return Prompt(index, kind, f"{kind} {digits}=", answer)

    def reward(self, prompt: Prompt, response: str) -> Reward:
        answer = response.strip()
        if answer == prompt.answer:
            return Reward(score=1.0, acc=1.0)
        if prompt.kind == "add":
            # digits of a sum are compared from the right (ones with ones)
            return Reward(score=_aligned_fraction(answer[::-1], prompt.answer[::-1]), acc=0.0)
        return Reward(score=_aligned_fraction(answer, prompt.answer), acc=0.0)


def _aligned_fraction(predicted: str, target: str) -> float:
    """Fraction of positions equal in both, over the longer of the two."""
    longest = max(len(predicted), len(target))
    if longest == 0:
        return 1.0
    return sum(p == t for p, t in zip(predicted, target, strict=False)) / longest
