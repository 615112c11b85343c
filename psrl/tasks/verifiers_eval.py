"""Held-out evaluation on a verifiers environment: its eval split, each example one rollout through the
environment's own loop and rubric (as a session of a run has it), the model behind an OpenAI client
per rollout.

An agent run trains on the environment's `dataset`; this scores a model on its `eval_dataset`, which
no training session drew from. An environment without one is refused: verifiers would fall back to
the training rows, and their score is not a held-out figure. A rollout whose rubric or model call
failed counts as failed (reported), not as a zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from psrl.tasks.verifiers_agent import VerifiersRolloutError, scored_rollout

# a client bound to one rollout (its own gateway session), closed after it
ClientFactory = Callable[[str], AbstractAsyncContextManager[Any]]


class NoEvalSplitError(ValueError):
    """The environment has no eval_dataset."""


@dataclass
class EvalScores:
    rewards: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    pass_threshold: float = 0.5

    @property
    def mean_reward(self) -> float:
        return statistics.fmean(self.rewards) if self.rewards else float("nan")

    @property
    def pass_rate(self) -> float:
        """Share of scored rollouts whose reward reaches the environment's pass threshold."""
        if not self.rewards:
            return float("nan")
        return sum(r >= self.pass_threshold for r in self.rewards) / len(self.rewards)


def eval_examples(env: Any, task_name: str, num_examples: int) -> list[dict[str, Any]]:
    """The first `num_examples` of the environment's eval split (all of it for -1)."""
    env.build_eval_dataset()
    if env.eval_dataset is None:
        raise NoEvalSplitError(
            f"task {task_name!r}: the environment has no eval_dataset, so there is nothing held out "
            "(verifiers would score the training rows); give its loader an eval_dataset"
        )
    return [dict(row) for row in env.get_eval_dataset(num_examples)]


async def evaluate(
    env: Any,
    task_name: str,
    examples: list[dict[str, Any]],
    client_for: ClientFactory,
    *,
    model: str,
    sampling_args: dict[str, Any],
    concurrency: int = 8,
) -> EvalScores:
    """Every example's rubric reward, `concurrency` rollouts at a time (the engine batches them)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int, example: dict[str, Any]) -> float | str:
        async with gate, client_for(f"eval-{index}") as client:
            try:
                return await scored_rollout(env, task_name, example, client, model, sampling_args)
            except VerifiersRolloutError as error:
                return f"example {index}: {error}"

    outcomes = await asyncio.gather(*(one(i, example) for i, example in enumerate(examples)))
    return EvalScores(
        rewards=[o for o in outcomes if isinstance(o, float)],
        failures=[o for o in outcomes if isinstance(o, str)],
        pass_threshold=float(env.pass_threshold),
    )


def gateway_sessions(url: str) -> ClientFactory:
    """Clients of a psrl gateway at `url` (``psrl.gateway.local.EngineGateway``): each rollout's client is
    bound to a session of its own, deleted after the rollout."""

    @contextlib.asynccontextmanager
    async def client_for(name: str) -> AsyncIterator[Any]:
        import httpx
        import openai

        async with httpx.AsyncClient(base_url=url, timeout=600) as http:
            opened = (await http.post("/sessions", json={"id": name})).raise_for_status().json()
            client = openai.AsyncOpenAI(base_url=f"{url}/sessions/{opened['id']}/v1", api_key="unused")
            try:
                yield client
            finally:
                await client.close()
                await http.delete(f"/sessions/{opened['id']}")

    return client_for
