"""The environment interface and the checks every step's answer passes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from psrl.tasks.base import Prompt, Reward


class EnvError(ValueError):
    """An environment answered with something that is not a valid step result."""


@dataclass(frozen=True, slots=True)
class StepResult:
    observation: str  # text appended to the episode before the next turn (ignored when done)
    reward: float  # reward so far; the final reward when done
    acc: float = 0.0  # task accuracy (1.0 = solved)
    done: bool = False


class Environment(Protocol):
    def reset(self) -> str:
        """The first observation (the prompt the model sees)."""
        ...

    def step(self, action: str) -> StepResult:
        """Answer one model turn (its text, end-of-sequence removed)."""
        ...


class EnvTask(Protocol):
    """A task whose prompts start episodes of an environment."""

    @property
    def name(self) -> str: ...

    def prompt(self, index: int) -> Prompt: ...

    def reward(self, prompt: Prompt, response: str) -> Reward: ...

    def make(self, prompt: Prompt) -> Environment:
        """A fresh environment for the episode of ``prompt`` (deterministic: the same prompt and
        actions always give the same observations, so an episode can be rebuilt by replaying)."""
        ...


def checked(result: Any) -> StepResult:
    """``result`` if it is a well-formed step result; otherwise EnvError saying what is wrong."""
    if not isinstance(result, StepResult):
        raise EnvError(f"step returned {type(result).__name__}, not a StepResult")
    if not isinstance(result.observation, str):
        raise EnvError(f"observation is {type(result.observation).__name__}, not text")
    for name in ("reward", "acc"):
        value = getattr(result, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise EnvError(f"{name} is {value!r}, not a finite number")
    return result
