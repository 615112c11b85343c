"""The agent that runs a verifiers environment in a psrl session (`agent.entry` of a verifiers task).

Each session is one `env.run_rollout` of the environment's dataset example: verifiers' own turn loop
(prompt, model call, `env_response`, stop conditions, tool calls) with an OpenAI client bound to the
session at the gateway, then its rubric. The session's reward is the rubric's reward; its accuracy is
whether that reward reaches the environment's `pass_threshold` (verifiers' pass@k criterion).

Failures fail only the session, with the reason in its `session.end` (counted like any failed
session): a reward function that raises or returns a non-number (verifiers would log it and score
0), a reward that is not a finite number, and a model call the gateway refused (the router ended the
session, a limit was reached). A rollout that verifiers ended because of the model's own output (an
empty reply, a malformed tool call) keeps the rubric's score, as it would in verifiers.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any

from psrl.tasks.verifiers_source import first_call, load_env

_REWARD_ERROR = "Error calling"  # the start of verifiers' log line for a reward function that raised


class VerifiersRolloutError(RuntimeError):
    """The rollout or its scoring failed (the text says how); the session fails."""


class _RubricErrors(logging.Handler):
    """Collects verifiers' error lines for reward functions that raised during one rollout."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(_REWARD_ERROR):
            self.messages.append(message)

    def __enter__(self) -> _RubricErrors:
        logging.getLogger(MODULE_LOGGER).addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        logging.getLogger(MODULE_LOGGER).removeHandler(self)


MODULE_LOGGER = "verifiers"
# the gateway's answer to a call past env.max_turns (HTTP 409, code max_turns); verifiers keeps only the
# exception's text, which for openai's errors is the message, not the code
MAX_TURNS_TEXT = "used its env.max_turns="


async def rollout(client: Any, row: dict[str, Any]) -> dict[str, float]:
    """Run the row's example through its environment with `client` (an `openai.AsyncOpenAI` bound to
    the session); its rubric's reward as `{score, acc}`."""
    spec = row["verifiers"]
    env = load_env(spec["task"], spec["kwargs"])
    example = env.get_dataset()[int(spec["example"])]
    if await first_call(env, example) != (row["messages"], row["tools"]):
        raise VerifiersRolloutError(f"example {spec['example']} of {spec['task']} is not the row's prompt "
                                    "(the environment's dataset changed since the rows were written)")  # fmt: skip
    score = await scored_rollout(env, spec["task"], example, client, spec["model"], dict(env.sampling_args))
    return {"score": score, "acc": 1.0 if score >= env.pass_threshold else 0.0}


async def scored_rollout(
    env: Any, task_name: str, example: dict[str, Any], client: Any, model: str, sampling_args: dict[str, Any]
) -> float:
    """One rollout of `example` through the environment's own loop with `client` (an `openai.AsyncOpenAI`),
    scored by its rubric; raises `VerifiersRolloutError` when the rubric or a model call failed."""
    from verifiers.clients import OpenAIChatCompletionsClient

    with _RubricErrors() as errors:
        output = await env.run_rollout(example, OpenAIChatCompletionsClient(client), model, sampling_args)
    if errors.messages:
        raise VerifiersRolloutError(f"the rubric of {task_name} failed: {'; '.join(errors.messages)}")
    refused = gateway_refusal(output.get("error"))
    if refused is not None:
        raise VerifiersRolloutError(f"a model call failed: {refused}")
    return checked_reward(task_name, output.get("reward"))


def gateway_refusal(error: Any) -> str | None:
    """Why a model call got no answer (an HTTP error from the gateway, or no connection), from verifiers'
    record of the rollout's error (its chain of exception class names); None when the rollout stopped
    because of what the model wrote, or because the session used up psrl's env.max_turns (which ends it
    as verifiers' own max_turns would)."""
    if not isinstance(error, dict):
        return None
    chain = set(str(error.get("error_chain_str", "")).split(" -> "))
    if not chain & openai_error_names():
        return None
    detail = str(error.get("error_chain_repr", "")) or str(error.get("message", ""))
    if MAX_TURNS_TEXT in detail:
        return None
    return detail[:500]


def openai_error_names() -> set[str]:
    import openai

    names, pending = set(), [openai.APIError]
    while pending:
        kind = pending.pop()
        names.add(kind.__name__)
        pending.extend(kind.__subclasses__())
    return names


def checked_reward(task_name: str, value: Any) -> float:
    """The rubric's reward as a float, or an error naming the task."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise VerifiersRolloutError(f"task {task_name!r}: the rubric's reward is {value!r}, not a finite number")
    return float(value)
