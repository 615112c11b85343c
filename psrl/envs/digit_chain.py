"""``digit_chain``: a chain of 1 to 3 short digit questions of the demo task, one per turn.

The first question is the prompt; each answer is scored with the demo task's partial credit and
the environment replies with the next question, until the chain ends (a variable number of turns).
The reward is the mean score over the chain; ``acc`` is 1 when every answer is exact. The demo
model answers single questions, so the chain trains the same skill across turns and its reward
rises within minutes on CPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from psrl.envs.base import StepResult
from psrl.tasks.base import Prompt, Reward
from psrl.tasks.demo import DemoTask

MAX_QUESTIONS = 3


@dataclass(frozen=True, slots=True)
class DigitChainTask:
    seed: int = 0
    name: str = "digit_chain"

    @property
    def questions(self) -> DemoTask:
        return DemoTask(seed=self.seed, max_length=6, length_skew=1.0, name="demo_short")

    def prompt(self, index: int) -> Prompt:
        count = 1 + random.Random(f"digit_chain:{self.seed}:{index}").randrange(MAX_QUESTIONS)
        chain = [self.questions.prompt(index * MAX_QUESTIONS + k) for k in range(count)]
        row = {
            "questions": [q.text for q in chain],
            "answers": [q.answer for q in chain],
            "kinds": [q.kind for q in chain],
        }
        return Prompt(index, "chain", chain[0].text, chain[0].answer, row=row)

    def reward(self, prompt: Prompt, response: str) -> Reward:
        """Single-turn scoring: the first answer only."""
        return self.questions.reward(_question(prompt, 0), response)

    def make(self, prompt: Prompt) -> DigitChain:
        return DigitChain(self, prompt)


@dataclass
class DigitChain:
    task: DigitChainTask
    prompt: Prompt
    scores: list[Reward] = field(default_factory=list)

    def reset(self) -> str:
        self.scores = []
        return self.prompt.text

    def step(self, action: str) -> StepResult:
        questions = self.prompt.row["questions"]
        self.scores.append(self.task.questions.reward(_question(self.prompt, len(self.scores)), action))
        reward = sum(s.score for s in self.scores) / len(questions)
        if len(self.scores) < len(questions):
            return StepResult(questions[len(self.scores)], reward, 0.0, done=False)
        return StepResult("", reward, float(all(s.acc == 1.0 for s in self.scores)), done=True)


def _question(prompt: Prompt, k: int) -> Prompt:
    row = prompt.row
    return Prompt(prompt.index, row["kinds"][k], row["questions"][k], row["answers"][k])
