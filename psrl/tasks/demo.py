"""The demo task: arithmetic and digit-string manipulation with answers of very different lengths.

Four kinds, chosen uniformly: `add` (sum of two numbers below 1000: answers of 1-4 characters),
and `copy`, `rev`, `sort` of a string of digits whose length is skewed towards short strings but
reaches `max_length` (answers of 1 to `max_length` characters, 128 by default). That spread gives
rollouts a long tail. The reward gives partial credit (the fraction of answer positions that are
right, counted over the longer of answer and response, so rambling on costs credit); `acc` is
exact match. Responses are compared as text after stripping surrounding whitespace. With
`exact_reward` the reward is exact match alone (the partial credit can be earned by answers of the
right length with wrong digits, which a policy learns to produce instead of right answers).

Held-out split: a prompt whose text hashes to 0 modulo `HELD_OUT_MODULUS` belongs to the `val`
split, every other one to `train`; each split redraws until it gets one of its own, so no
held-out prompt is ever trained on and `prompt(index)` stays a pure function of (seed, index).
The held-out prompts are the same for every seed, so runs of different seeds are compared on
the same questions.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, replace
from typing import Literal

from psrl.tasks.base import Prompt, Reward

KINDS = ("add", "copy", "rev", "sort")
HELD_OUT_MODULUS = 8  # one prompt text in 8 is held out


@dataclass(frozen=True, slots=True)
class DemoTask:
    seed: int = 0
    max_length: int = 128
    # lengths are 1 + (max_length - 1) * u**length_skew with u uniform: 3 = mostly short, 1 = uniform
    length_skew: float = 3.0
    name: str = "demo"
    split: Literal["train", "val"] = "train"
    exact_reward: bool = False

    def held_out(self) -> DemoTask:
        """The same task's held-out split (prompts never drawn for training)."""
        return replace(self, split="val")

    def prompt(self, index: int) -> Prompt:
        # the held-out prompts do not depend on the seed: runs of any seed are evaluated on the same ones
        key = f"demo:{self.seed}:{index}" if self.split == "train" else f"demo:val:{index}"
        rng = random.Random(key)
        while True:
            prompt = self._draw(rng, index)
            if is_held_out(prompt.text) == (self.split == "val"):
                return prompt

    def _draw(self, rng: random.Random, index: int) -> Prompt:
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
        if self.exact_reward:
            return Reward(score=0.0, acc=0.0)
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


def is_held_out(text: str) -> bool:
    """Whether a prompt text belongs to the held-out split."""
    return zlib.crc32(text.encode()) % HELD_OUT_MODULUS == 0
