"""The evaluation planner (when, what, metrics), pass@k, and the held-out split of the demo task."""

from __future__ import annotations

import numpy as np
import pytest

from bus.messages import EvalResult, FinishReason
from psrl.config import load_config
from psrl.evaluation.passk import pass_at_k
from psrl.evaluation.planner import EvalPlanner
from psrl.tasks import DemoTask
from psrl.tasks.base import Prompt, Reward
from psrl.tasks.demo import is_held_out


class Source:
    """Prompt i's right answer is the token [i]."""

    def __init__(self) -> None:
        self.stop_token_ids = [0]

    def prompt(self, index: int) -> Prompt:
        return Prompt(index, "t", f"q{index}", str(index))

    def token_ids(self, prompt: Prompt) -> np.ndarray:
        return np.asarray([100 + prompt.index, 7], np.int32)

    def score(self, prompt: Prompt, token_ids: np.ndarray) -> Reward:
        right = token_ids.tolist() == [prompt.index]
        return Reward(float(right), float(right))


def planner(*overrides: str) -> EvalPlanner:
    config = load_config("demo", ["trainer.eval_interval=10", "trainer.total_steps=25", *overrides])
    return EvalPlanner(config, Source())


def answer(p: EvalPlanner, sample_id: int, tokens: list[int], version: int, now: float = 1.0) -> dict | None:
    assert p.round is not None
    result = EvalResult(instance=p.round.instance, round=p.round.number, sample_id=sample_id,
                        token_ids=np.asarray(tokens, np.int32), version=version,
                        finish_reason=FinishReason.STOP)  # fmt: skip
    return p.record(result, now)


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_a_round_asks_greedy_and_sampled_answers_and_scores_them() -> None:
    p = planner("eval.num_prompts=2", "eval.k=2", "task.temperature=0.8")
    assert p.is_due(0)
    request = p.start("rollout-1", 0, now=0.0)
    assert request.instance == "rollout-1" and len(request.sample_ids) == 2 * 3
    assert [s.temperature for s in request.sampling] == [0.0, 0.8, 0.8] * 2
    assert request.prompt_token_ids.tolist() == [100, 7] * 3 + [101, 7] * 3
    assert not p.is_due(0)  # one round at a time
    # prompt 0: greedy right, one sample of two right; prompt 1: greedy wrong, no sample right
    answers = [[0], [0], [9], [5], [5], [5]]
    for sample_id, tokens in enumerate(answers[:-1]):
        assert answer(p, sample_id, tokens, version=0) is None
    metrics = answer(p, 5, answers[-1], version=0, now=3.0)
    assert metrics is not None
    assert metrics["eval/acc"] == 0.5 and metrics["eval/pass@2"] == 0.5 and metrics["eval/sampled_acc"] == 0.25
    assert metrics["eval/version"] == 0 and metrics["eval/mean_length"] == 1 and metrics["eval/duration_s"] == 3.0
    assert p.evaluated == [0] and p.next_due == 10


def test_due_versions_are_every_interval_and_the_last() -> None:
    p = planner("eval.num_prompts=1", "eval.k=0")
    seen = []
    for version in (0, 4, 13, 21, 25):
        if p.is_due(version):
            p.start("i", version, now=0.0)
            answer(p, 0, [0], version)
            seen.append(version)
    assert seen == [0, 13, 21, 25]  # 10 was skipped past: measured at 13; 20 at 21; the last, 25
    assert p.is_last_measured and not p.is_due(30)


def test_results_of_another_round_or_instance_are_ignored_and_a_lost_instance_loses_its_round() -> None:
    p = planner("eval.num_prompts=1", "eval.k=0")
    p.start("a", 0, now=0.0)
    stray = EvalResult(instance="b", round=1, sample_id=0, token_ids=np.zeros(1, np.int32), version=0,
                       finish_reason=FinishReason.STOP)  # fmt: skip
    assert p.record(stray, 1.0) is None and p.round is not None
    assert not p.abandon("b") and p.abandon("a")
    assert p.is_due(0) and p.evaluated == []


def test_failed_answers_count_as_wrong_and_as_errors() -> None:
    p = planner("eval.num_prompts=1", "eval.k=0")
    p.start("a", 0, now=0.0)
    failed = EvalResult(instance="a", round=1, sample_id=0, token_ids=np.zeros(0, np.int32), version=-1,
                        finish_reason=FinishReason.ERROR, error="too long")  # fmt: skip
    metrics = p.record(failed, 1.0)
    assert metrics is not None and metrics["eval/acc"] == 0 and metrics["eval/num_errors"] == 1


def test_the_demo_tasks_held_out_split_is_disjoint_from_training() -> None:
    task = DemoTask(seed=0, max_length=6, length_skew=1.0)
    train = {task.prompt(i).text for i in range(3000)}
    held_out = [task.held_out().prompt(i) for i in range(300)]
    assert all(is_held_out(p.text) for p in held_out) and not any(is_held_out(t) for t in train)
    assert not train & {p.text for p in held_out}
    assert task.held_out().prompt(7) == task.held_out().prompt(7)  # pure in (seed, index)
    assert len({p.text for p in held_out}) > 200  # short digit strings repeat
