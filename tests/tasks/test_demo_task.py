"""The demo task: seeded prompts, verifiable partial-credit reward, registry."""

from __future__ import annotations

import pytest

from psrl.errors import ConfigError
from psrl.tasks import DemoTask, Prompt, Reward, get_task, task_names
from psrl.tasks.demo import KINDS


def test_prompts_are_a_pure_function_of_seed_and_index() -> None:
    assert [get_task("demo", 3).prompt(i) for i in range(20)] == [DemoTask(seed=3).prompt(i) for i in range(20)]
    assert DemoTask(seed=3).prompt(5) != DemoTask(seed=4).prompt(5)
    assert DemoTask(seed=3).prompt(5).index == 5


def test_all_kinds_appear_with_answers_from_one_to_over_a_hundred_characters() -> None:
    task = DemoTask(seed=0)
    prompts = [task.prompt(i) for i in range(4000)]
    assert {p.kind for p in prompts} == set(KINDS)
    lengths = [len(p.answer) for p in prompts]
    assert min(lengths) == 1 and max(lengths) >= 120
    assert sorted(lengths)[len(lengths) // 2] < 20  # skewed: most answers are short


@pytest.mark.parametrize("index", range(40))
def test_reference_answers_are_correct_and_score_one(index: int) -> None:
    task = DemoTask(seed=1)
    prompt = task.prompt(index)
    kind, _, rest = prompt.text.rstrip("=").partition(" ")
    if kind == "add":
        expected = str(sum(int(n) for n in rest.split()))
    else:
        expected = {"copy": rest, "rev": rest[::-1], "sort": "".join(sorted(rest))}[kind]
    assert prompt.answer == expected and rest.replace(" ", "").isdigit()
    assert task.reward(prompt, prompt.answer) == Reward(score=1.0, acc=1.0)
    assert task.reward(prompt, f"  {prompt.answer}\n") == Reward(score=1.0, acc=1.0)


def test_partial_credit_is_graded_and_bounded() -> None:
    task = DemoTask()
    prompt = Prompt(0, "sort", "sort 312=", "123")
    assert task.reward(prompt, "124").score == pytest.approx(2 / 3)
    assert task.reward(prompt, "1233").score == pytest.approx(3 / 4)  # extra output costs credit
    assert task.reward(prompt, "").score == 0.0
    assert task.reward(prompt, "garbage !!").score == 0.0
    assert task.reward(prompt, "124").acc == 0.0
    add = Prompt(1, "add", "add 500 734=", "1234")
    assert task.reward(add, "1334").score == pytest.approx(3 / 4)
    assert task.reward(add, "234").score == pytest.approx(3 / 4)  # digits are compared from the right
    for response in ["123", "x", "12", "32109", "", "1 2 3"]:
        assert 0.0 <= task.reward(prompt, response).score <= 1.0


def test_prompt_round_trips_as_plain_data() -> None:
    prompt = DemoTask(seed=2).prompt(7)
    assert Prompt.from_dict(prompt.to_dict()) == prompt
    assert all(isinstance(value, int | str | tuple | dict) for value in prompt.to_dict().values())


def test_unknown_task_is_a_config_error() -> None:
    assert "demo" in task_names()
    with pytest.raises(ConfigError, match="unknown task"):
        get_task("nope")
