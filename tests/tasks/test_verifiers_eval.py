"""Held-out evaluation on a verifiers environment: its eval split (never the training rows), each
example a rollout of the environment's own loop and rubric against psrl's gateway over an embedded
engine, greedily; failed rollouts counted apart from the rewards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from psrl.tasks.verifiers_source import INSTALL

pytest.importorskip("verifiers", reason=f"needs the extra: {INSTALL}")
pytestmark = pytest.mark.verifiers

import verifiers as vf  # noqa: E402

from psrl.assets import DEMO_MODEL_DIR  # noqa: E402
from psrl.gateway.local import EngineGateway  # noqa: E402
from psrl.gateway.sessions import Settings  # noqa: E402
from psrl.tasks.verifiers_eval import NoEvalSplitError, eval_examples, evaluate, gateway_sessions  # noqa: E402
from psrl.tasks.verifiers_source import load_env  # noqa: E402

ENVS = Path(__file__).resolve().parents[2] / "examples" / "verifiers" / "sum_env.py"


def task(loader: str) -> str:
    return f"verifiers:{ENVS}:{loader}"


def test_the_eval_split_asks_nothing_the_training_rows_ask() -> None:
    env = load_env(task("load_single"), {"num_examples": 64, "seed": 0})
    rows = eval_examples(env, "single", -1)
    assert len(rows) == 64
    assert {row["question"] for row in rows}.isdisjoint(env.get_dataset()["question"])


def test_an_environment_without_an_eval_split_is_refused() -> None:
    env = load_env(task("load_raising"), {})
    with pytest.raises(NoEvalSplitError, match="no eval_dataset"):
        eval_examples(env, "raising", 8)


def run(env: vf.Environment, name: str, examples: list[dict]) -> tuple[list[float], list[str]]:
    with EngineGateway(str(DEMO_MODEL_DIR), settings=Settings(max_turn_tokens=8), temperature=0.0) as gateway:
        scores = asyncio.run(evaluate(env, name, examples, gateway_sessions(gateway.url), model="psrl",
                                      sampling_args=dict(env.sampling_args), concurrency=4))  # fmt: skip
    return scores.rewards, scores.failures


def test_greedy_rollouts_through_the_gateway_are_scored_by_the_rubric_and_repeat_exactly() -> None:
    env = load_env(task("load_retry"), {"num_examples": 16, "seed": 0, "max_turns": 2})
    examples = eval_examples(env, "retry", 6)
    rewards, failures = run(env, "retry", examples)
    assert failures == [] and len(rewards) == 6
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert run(env, "retry", examples)[0] == rewards  # greedy: the same answers, the same scores


def test_a_rubric_that_raises_fails_its_rollouts_instead_of_scoring_zero() -> None:
    env = load_env(task("load_raising"), {})
    rewards, failures = run(env, "raising", [dict(row) for row in env.get_dataset(3)])
    assert rewards == [] and len(failures) == 3
    assert "divided by zero" in failures[0]
