"""Three small verifiers environments built from verifiers' own classes, for psrl's example and tests.

* `load_single`: a `SingleTurnEnv`: "sum A B", answered in one turn.
* `load_retry`: a `MultiTurnEnv`: a wrong answer gets "wrong try again" back, up to `max_turns`.
* `load_tool`: a `ToolEnv` with an `add` tool; the episode ends when the model answers without a call.

The texts keep to the shipped demo model's vocabulary (a-z, 0-9, '=', space). Rewards use verifiers'
`Rubric` with the default `Parser` (the last answer's text): 1 for the right sum, else partial credit
for right digits in the right places (so a weak model still gets a signal).
"""

from __future__ import annotations

import random
from typing import Any

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "answer with the sum only"


def sums(num_examples: int, seed: int, terms: int = 2) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_examples):
        numbers = [rng.randrange(10, 50) for _ in range(terms)]
        rows.append({"question": "sum " + " ".join(map(str, numbers)), "answer": str(sum(numbers))})
    return Dataset.from_list(rows)


def held_out_sums(num_examples: int, seed: int, terms: int = 2) -> Dataset:
    """Sums none of `sums(num_examples, seed)`'s rows ask: the environments' eval split."""
    seen = set(sums(num_examples, seed, terms)["question"])
    rows = [row for row in sums(4 * num_examples, seed + 1, terms) if row["question"] not in seen]
    return Dataset.from_list(rows[:num_examples])


def digits_right(answer: str, text: str) -> float:
    """1 for the exact sum; else half the share of right digits, aligned from the last one."""
    got = "".join(ch for ch in text if ch.isdigit())[::-1]
    want = answer[::-1]
    if got == want:
        return 1.0
    return 0.5 * sum(a == b for a, b in zip(got, want, strict=False)) / max(len(want), 1)


def sum_reward(completion: Any, answer: str, parser: vf.Parser, **_: Any) -> float:
    return digits_right(answer, parser.parse_answer(completion) or "")


def rubric() -> vf.Rubric:
    return vf.Rubric(funcs=[sum_reward], weights=[1.0])


def load_single(num_examples: int = 64, seed: int = 0) -> vf.Environment:
    return vf.SingleTurnEnv(dataset=sums(num_examples, seed), eval_dataset=held_out_sums(num_examples, seed),
                            system_prompt=SYSTEM_PROMPT, rubric=rubric())  # fmt: skip


class RetryEnv(vf.MultiTurnEnv):
    """A wrong answer is told so and may be tried again, until it is right or the turns run out."""

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        return [{"role": "user", "content": "wrong try again"}]

    @vf.stop
    async def answered(self, state: vf.State) -> bool:
        if not state["trajectory"]:
            return False
        last = state["trajectory"][-1]["completion"][-1]
        return digits_right(str(state["answer"]), self.parser.parse_answer([last]) or "") == 1.0


def load_retry(num_examples: int = 64, seed: int = 0, max_turns: int = 3) -> vf.Environment:
    return RetryEnv(dataset=sums(num_examples, seed), eval_dataset=held_out_sums(num_examples, seed),
                    system_prompt=SYSTEM_PROMPT, rubric=rubric(), max_turns=max_turns)  # fmt: skip


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return int(a) + int(b)


def load_tool(num_examples: int = 64, seed: int = 0, max_turns: int = 3) -> vf.Environment:
    return vf.ToolEnv(dataset=sums(num_examples, seed, terms=3), eval_dataset=held_out_sums(num_examples, seed, 3),
                      system_prompt="add with the add tool then answer", tools=[add], rubric=rubric(),
                      max_turns=max_turns)  # fmt: skip


def load_raising(num_examples: int = 8) -> vf.Environment:
    """A rubric whose reward function raises (the tests' bad input)."""

    def broken(completion: Any, answer: str) -> float:
        raise ZeroDivisionError("the scorer divided by zero")

    return vf.SingleTurnEnv(dataset=sums(num_examples, 0), rubric=vf.Rubric(funcs=[broken]))


def load_not_a_number(num_examples: int = 8) -> vf.Environment:
    """A reward function that returns text (the tests' bad input)."""

    def wordy(completion: Any, answer: str) -> Any:
        return "five"

    return vf.SingleTurnEnv(dataset=sums(num_examples, 0), rubric=vf.Rubric(funcs=[wordy]))
