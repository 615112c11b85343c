"""reasoning-gym as a task source: scoring against the library's own scorer on recorded samples, prompt
rendering, the held-out split, composite datasets and the refusals of bad input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from psrl.assets import DEMO_MODEL_DIR
from psrl.config.loader import load_config
from psrl.config.rules import check
from psrl.errors import ConfigError
from psrl.tasks.reasoning_gym import (
    HELD_OUT_SEED,
    INSTALL,
    ReasoningGymTask,
    ScoreTypeError,
    SourceSpec,
    checked_score,
    closed,
    render,
    source_problems,
)

SAMPLES = json.loads((Path(__file__).parent / "data" / "reasoning_gym_samples.json").read_text())
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)


def make_task(tokenizer: Any, name: str, kwargs: dict[str, Any], seed: int = 0, **options: Any) -> ReasoningGymTask:
    task_name = f"reasoning_gym:{name}"
    return ReasoningGymTask(task_name, SourceSpec.parse(task_name, kwargs), tokenizer, seed=seed, **options)


@pytest.mark.reasoning_gym
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: f"{s['dataset']}:{s['response'][:20]}")
def test_recorded_samples_score_as_the_library_scores_them(tokenizer: Any, sample: dict[str, Any]) -> None:
    pytest.importorskip("reasoning_gym", reason=f"needs the extra: {INSTALL}")
    from reasoning_gym import create_dataset
    from reasoning_gym.utils import extract_answer

    task = make_task(tokenizer, sample["dataset"], {**sample["config"], "size": 100}, seed=sample["seed"], eval_size=4)
    prompt = task.prompt(sample["index"])
    # the library still generates the recorded problem at this seed and index
    assert (prompt.row["question"], prompt.answer) == (sample["question"], sample["answer"])
    assert prompt.row["position"] == sample["index"]
    reward = task.reward(prompt, sample["response"])
    library = create_dataset(sample["dataset"], seed=sample["seed"], size=100, **sample["config"])
    entry = library[sample["index"]]
    assert reward.score == pytest.approx(library.score_answer(extract_answer(sample["response"]), entry))
    assert reward.score == pytest.approx(sample["score"])
    assert reward.acc == (1.0 if sample["score"] >= 1.0 else 0.0)


def test_prompts_render_with_the_chat_template_and_the_response_prefix(tokenizer: Any) -> None:
    chat = AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)
    chat.chat_template = CHAT_TEMPLATE
    text, ids = render("add 1 2?", chat, "be brief", "<answer>")
    assert text == "<|system|>be brief\n<|user|>add 1 2?\n<|assistant|><answer>"
    assert ids == chat.encode(text, add_special_tokens=False)
    assert render("add 1 2?", chat, None)[0] == "<|user|>add 1 2?\n<|assistant|>"
    # a tokenizer without a chat template gets the plain text
    plain_text, plain_ids = render("add 1 2?", tokenizer, "be brief")
    assert plain_text == "be brief\n\nadd 1 2?\n" and plain_ids == tokenizer.encode(plain_text)


def test_an_answer_ended_by_end_of_sequence_closes_its_tag() -> None:
    assert closed("<answer> 12", "answer") == "<answer> 12</answer>"
    assert closed("<answer>12</answer> more", "answer") == "<answer>12</answer> more"
    assert closed("no tag at all", "answer") == "no tag at all"
    assert closed("<answer>12", None) == "<answer>12"


def test_a_score_that_is_not_a_number_names_the_task() -> None:
    assert checked_score("reasoning_gym:gcd", 1) == 1.0
    for value in ("1.0", None, True, [1.0]):
        with pytest.raises(ScoreTypeError, match=r"reasoning_gym:gcd.*not a number"):
            checked_score("reasoning_gym:gcd", value)


@pytest.mark.reasoning_gym
def test_a_scorer_returning_a_string_is_counted_as_an_error_naming_the_task(tokenizer: Any) -> None:
    pytest.importorskip("reasoning_gym", reason=f"needs the extra: {INSTALL}")
    from psrl.rewards.scorer import TaskScorer

    task = make_task(tokenizer, "gcd", {"size": 50}, eval_size=4)
    prompt = task.prompt(0)
    task._dataset().score_answer = lambda answer, entry: "1.0"  # a scorer of a user's own dataset gone wrong
    scorer = TaskScorer(task)
    assert scorer.score(prompt, "<answer>1</answer>", [1]).score == 0.0
    assert "reasoning_gym:gcd" in scorer.take_first_error()
    assert scorer.take_metrics()["reward/num_errors"] == 1


@pytest.mark.reasoning_gym
def test_held_out_problems_come_from_their_own_seed_and_are_never_trained_on(tokenizer: Any) -> None:
    pytest.importorskip("reasoning_gym", reason=f"needs the extra: {INSTALL}")
    # one-digit sums: a problem space small enough that training draws hit held-out questions
    kwargs = {"size": 200, "min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+"]}
    train = make_task(tokenizer, "basic_arithmetic", kwargs, seed=5, eval_size=32)
    held_out = {train.held_out().prompt(i).row["question"] for i in range(32)}
    drawn = [train.prompt(i) for i in range(200)]
    assert not held_out & {p.row["question"] for p in drawn}
    assert any(p.row["position"] != p.index for p in drawn)  # some draws were replaced
    other_seed = make_task(tokenizer, "basic_arithmetic", kwargs, seed=6, eval_size=32).held_out()
    assert {other_seed.prompt(i).row["question"] for i in range(32)} == held_out
    assert train.held_out()._dataset().seed == HELD_OUT_SEED


@pytest.mark.reasoning_gym
def test_composite_datasets_mix_by_weight_and_score_each_kind(tokenizer: Any) -> None:
    pytest.importorskip("reasoning_gym", reason=f"needs the extra: {INSTALL}")
    datasets = [{"name": "gcd", "weight": 3, "config": {}}, {"name": "leg_counting", "weight": 1, "config": {}}]
    task = make_task(tokenizer, "composite", {"size": 400, "datasets": datasets}, eval_size=8)
    prompts = [task.prompt(i) for i in range(200)]
    kinds = [p.kind for p in prompts]
    assert set(kinds) == {"gcd", "leg_counting"}
    assert 0.6 < kinds.count("gcd") / len(kinds) < 0.9  # weight 3 of 4
    for prompt in prompts[:20]:
        assert task.reward(prompt, f"<answer>{prompt.answer}</answer>").acc == 1.0
        assert task.reward(prompt, "<answer>-1</answer>").acc == 0.0


@pytest.mark.reasoning_gym
def test_unknown_datasets_and_bad_kwargs_are_refused_with_field_value_and_fix() -> None:
    pytest.importorskip("reasoning_gym", reason=f"needs the extra: {INSTALL}")
    [unknown] = source_problems("reasoning_gym:basic_arithmetc", {})
    assert unknown.paths == ("task.name",) and "basic_arithmetc" in unknown.value
    assert "basic_arithmetic" in unknown.fix
    [bad] = source_problems("reasoning_gym:basic_arithmetic", {"bogus": 1})
    assert bad.paths == ("task.kwargs",) and "bogus" in bad.message and "max_terms" in bad.fix
    [invalid] = source_problems("reasoning_gym:basic_arithmetic", {"min_terms": 5, "max_terms": 2})
    assert "max_terms must be >= min_terms" in invalid.message
    [inner] = source_problems("reasoning_gym:composite", {"datasets": [{"name": "gdc", "weight": 1}]})
    assert "'gdc'" in inner.message and "gcd" in inner.fix
    assert list(source_problems("reasoning_gym:composite", {"datasets": [{"name": "gcd", "weight": 1}]})) == []


@pytest.mark.reasoning_gym
def test_preflight_refuses_a_bad_source_and_prompts_longer_than_the_limit() -> None:
    pytest.importorskip("reasoning_gym", reason=f"needs the extra: {INSTALL}")
    from psrl.preflight import check_environment

    bad = load_config(None, ["task.name=reasoning_gym:nope"])
    assert [p.paths for p in check_environment(bad)] == [("task.name",)]
    long = load_config(None, ["task.name=reasoning_gym:syllogism", "task.max_prompt_length=16"])
    [problem] = check_environment(long)
    assert problem.paths == ("task.max_prompt_length",) and "task.max_prompt_length=" in problem.fix
    assert check_environment(load_config(None, ["task.name=reasoning_gym:gcd", "task.max_prompt_length=2048"])) == []


def test_a_missing_extra_is_named_before_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "reasoning_gym" else real(name))
    [missing] = source_problems("reasoning_gym:gcd", {})
    assert missing.paths == ("task.name",) and "reasoning-gym extra" in missing.message and missing.fix == INSTALL
    with pytest.raises(ConfigError, match="reasoning-gym"):
        ReasoningGymTask.from_config(load_config(None, ["task.name=reasoning_gym:gcd"]), None)


def test_task_kwargs_belong_to_reasoning_gym_tasks() -> None:
    with pytest.raises(ConfigError, match="task 'demo' takes no kwargs") as refused:
        load_config(None, ["task.kwargs={size: 5}"])
    assert refused.value.problems[0].paths == ("task.kwargs", "task.name")
    assert check(load_config(None, ["task.name=reasoning_gym:gcd", "task.kwargs={size: 5}"])) == []


@pytest.mark.parametrize(
    ("file", "task"),
    [("config.yaml", "needle_haystack"), ("word_reversal.yaml", "word_sequence_reversal")],
)
def test_the_example_configs_are_valid(file: str, task: str) -> None:
    example = Path(__file__).parents[2] / "examples" / "reasoning_gym" / file
    config = load_config(str(example))
    assert config.task.name == f"reasoning_gym:{task}" and config.task.response_prefix == "<answer>"
    assert config.model.path is not None and config.model.path.endswith("SmolLM2-135M-Instruct")
    assert check(config) == []
