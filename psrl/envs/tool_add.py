"""``tool_add``: sum three numbers with an adding tool, then answer.

The prompt is ``sum A B C=``. Each turn the model either calls the tool, ``add X Y`` (two numbers),
and the environment executes it and replies ``=X+Y`` (the value), or answers with ``ans N``, which
ends the episode: reward 1 for the right sum, else the demo task's digit-wise partial credit,
halved. Any other turn gets ``=err`` back and costs a turn. Every turn is one tool round trip, so
the episode's length depends on the policy.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from psrl.envs.base import StepResult
from psrl.tasks.base import Prompt, Reward
from psrl.tasks.demo import _aligned_fraction

_CALL = re.compile(r"^add (\d{1,6}) (\d{1,6})$")
_ANSWER = re.compile(r"^ans (\d{1,7})$")


@dataclass(frozen=True, slots=True)
class ToolAddTask:
    seed: int = 0
    name: str = "tool_add"

    def prompt(self, index: int) -> Prompt:
        rng = random.Random(f"tool_add:{self.seed}:{index}")
        numbers = [rng.randrange(100) for _ in range(3)]
        return Prompt(index, "sum3", "sum {} {} {}=".format(*numbers), str(sum(numbers)))

    def reward(self, prompt: Prompt, response: str) -> Reward:
        found = _ANSWER.match(response.strip())
        if found is None:
            return Reward(0.0, 0.0)
        answer = found.group(1)
        if answer == prompt.answer:
            return Reward(1.0, 1.0)
        return Reward(0.5 * _aligned_fraction(answer[::-1], prompt.answer[::-1]), 0.0)

    def make(self, prompt: Prompt) -> ToolAdd:
        return ToolAdd(self, prompt)


@dataclass
class ToolAdd:
    task: ToolAddTask
    prompt: Prompt

    def reset(self) -> str:
        return self.prompt.text

    def step(self, action: str) -> StepResult:
        text = action.strip()
        call = _CALL.match(text)
        if call is not None:
            return StepResult(f"={int(call.group(1)) + int(call.group(2))}", 0.0)
        if _ANSWER.match(text) is not None:
            reward = self.task.reward(self.prompt, text)
            return StepResult("", reward.score, reward.acc, done=True)
        return StepResult("=err", 0.0)
