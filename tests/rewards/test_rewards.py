"""Reward functions: loading by file or module, the arguments they name, every way a call can fail."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from psrl.config.data import RewardSettings
from psrl.rewards import FunctionScorer, RewardLoadError, TaskScorer, load_reward_function, to_reward
from psrl.rewards.builtin import exact_match, extract_boxed, math_answer, regex_format
from psrl.tasks import DemoTask
from psrl.tasks.base import Prompt, Reward

PROMPT = Prompt(3, "train", "add 1 2=", "3", (5, 6, 7), {"prompt": "add 1 2=", "answer": "3", "level": 2})

REWARD_FILE = """
import asyncio, time
from helper import BONUS

def plain(response, answer):
    return float(response.strip() == answer)

def everything(prompt, response, prompt_ids, response_ids, answer, row, level, scale=1.0):
    return {"score": scale * len(response_ids), "acc": 1.0, "level": level, "prompt_len": len(prompt_ids)}

def anything(**kwargs):
    return {"score": BONUS, "n": len(kwargs)}

async def later(response):
    await asyncio.sleep(0.01)
    return 0.5

def slow(response):
    time.sleep(5)
    return 1.0

def raises(response):
    raise RuntimeError("boom")

def garbage(response):
    return "yes"

def needs_unknown(response, judge_url):
    return 0.0
"""


@pytest.fixture()
def reward_file(tmp_path: Path) -> Path:
    (tmp_path / "helper.py").write_text("BONUS = 2.0\n")
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


def scorer(spec: str, **settings: object) -> FunctionScorer:
    function = load_reward_function(spec, columns=["prompt", "answer", "level"], kwargs=settings.get("kwargs", {}))  # type: ignore[arg-type]
    return FunctionScorer(function, RewardSettings(**settings))  # type: ignore[arg-type]


def test_a_file_function_gets_the_arguments_it_names(reward_file: Path) -> None:
    assert scorer(f"{reward_file}:plain").score(PROMPT, " 3 ", [9]) == Reward(1.0, 1.0)
    full = scorer(f"{reward_file}:everything", kwargs={"scale": 0.5})
    assert full.score(PROMPT, "3", [9, 9]) == Reward(1.0, 1.0)
    assert full.take_metrics() == {"reward/num_scored": 1.0, "reward/level": 2.0, "reward/prompt_len": 3.0}
    assert scorer(f"{reward_file}:anything").score(PROMPT, "3", [9]).score == 2.0  # imported its neighbour


def test_async_functions_and_module_paths(reward_file: Path) -> None:
    assert scorer(f"{reward_file}:later").score(PROMPT, "3", [1]) == Reward(0.5, 0.0)
    assert scorer("psrl.rewards.builtin:math_answer").score(PROMPT, "so \\boxed{3}", [1]).score == 1.0


def test_failures_score_the_error_score_are_counted_and_never_raise(reward_file: Path) -> None:
    for name, counter in (("raises", "num_errors"), ("garbage", "num_errors"), ("slow", "num_timeouts")):
        s = scorer(f"{reward_file}:{name}", timeout_s=0.2, error_score=-1.0)
        started = time.monotonic()
        assert s.score(PROMPT, "3", [1]) == Reward(-1.0, 0.0)
        assert time.monotonic() - started < 4, "a timed-out call must not be waited for"
        assert s.take_metrics() == {f"reward/{counter}": 1.0}
        s.close()


def test_load_errors_name_the_problem(reward_file: Path, tmp_path: Path) -> None:
    cases = {
        f"{reward_file}:missing": "has no 'missing'",
        f"{reward_file}:needs_unknown": "required argument 'judge_url'",
        f"{tmp_path}/nope.py:fn": "no such file",
        "no_such_module_xyz:fn": "cannot import",
        "just_a_name": "write it as",
    }
    for spec, message in cases.items():
        with pytest.raises(RewardLoadError, match=message):
            load_reward_function(spec)
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('no judge')\n")
    with pytest.raises(RewardLoadError, match="no judge"):
        load_reward_function(f"{broken}:fn")
    assert load_reward_function(f"{reward_file}:needs_unknown", kwargs=["judge_url"]).parameters[-1] == "judge_url"


def test_reward_values() -> None:
    assert to_reward(1) == (Reward(1.0, 1.0), {})
    assert to_reward({"score": 0.3, "acc": 1, "fmt": 1}) == (Reward(0.3, 1.0), {"fmt": 1.0})
    for bad in (float("nan"), None, {"acc": 1.0}, {"score": "x"}):
        with pytest.raises(ValueError):
            to_reward(bad)


def test_task_scorer_survives_a_failing_task() -> None:
    class Broken(DemoTask):
        def reward(self, prompt: Prompt, response: str) -> Reward:
            raise KeyError("oops")

    ok = TaskScorer(DemoTask())
    prompt = DemoTask().prompt(0)
    assert ok.score(prompt, prompt.answer, []) == Reward(1.0, 1.0)
    broken = TaskScorer(Broken(), error_score=0.0)
    assert broken.score(prompt, prompt.answer, []) == Reward(0.0, 0.0)
    assert broken.take_metrics() == {"reward/num_errors": 1.0}


def test_builtin_verifiers() -> None:
    assert extract_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert extract_boxed("no box") is None
    cases = [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{1,000}", "1000"),
        ("is 42.", "42"),
        ("\\boxed{\\text{(A)}}", "(A)"),
        ("\\boxed{ 3 }", "\\boxed{3}"),
        ("$\\boxed{90^\\circ}$", "90"),
    ]
    for response, answer in cases:
        assert math_answer(response, answer) == 1.0, (response, answer)
    for response, answer in (("\\boxed{2}", "3"), ("no number", "3"), ("\\boxed{1/0}", "2")):
        assert math_answer(response, answer) == 0.0, (response, answer)
    assert exact_match(" 12 \n", "12") == 1.0 and exact_match("12 3", "123") == 0.0
    assert regex_format("<think>x</think> 12", r"<think>.*</think>\s*\d+") == 1.0
    assert regex_format("12", r"<think>.*</think>\s*\d+") == 0.0
