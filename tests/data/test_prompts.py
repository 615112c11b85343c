"""Prompt datasets: jsonl, parquet and datasets directories; prompt strings and chat messages; row order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from psrl.assets import DEMO_MODEL_DIR
from psrl.config import load_config
from psrl.data import DataError, PromptDataset, RenderSettings, load_split, read_table
from psrl.flows.task_source import make_task

ROWS = [{"prompt": f"add {i} {i + 1}=", "answer": str(2 * i + 1), "level": i % 3} for i in range(10)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_parquet_and_saved_directory_read_the_same_rows(tmp_path: Path) -> None:
    import datasets

    jsonl = write_jsonl(tmp_path / "train.jsonl", ROWS)
    table = datasets.Dataset.from_list(ROWS)
    table.to_parquet(str(tmp_path / "train.parquet"))
    table.save_to_disk(str(tmp_path / "saved"))
    for path in (jsonl, tmp_path / "train.parquet", tmp_path / "saved"):
        assert [dict(r) for r in read_table([path])] == ROWS, path
    assert len(read_table([jsonl, tmp_path / "train.parquet"])) == 20


def test_unreadable_inputs_are_data_errors_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{not json\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "x.csv").write_text("a,b\n")
    for name, message in (("missing.jsonl", "no such file"), ("bad.jsonl", "cannot be read"),
                          ("x.csv", "unknown format"), ("empty.jsonl", "no rows|cannot be read")):  # fmt: skip
        with pytest.raises(DataError, match=message) as caught:
            read_table([tmp_path / name])
        assert name in str(caught.value)


def test_prompt_index_is_pure_and_epochs_visit_every_row_once(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    table = read_table([write_jsonl(tmp_path / "t.jsonl", ROWS)])
    dataset = PromptDataset("train", table, tokenizer, RenderSettings(), shuffle=True, seed=5)
    first = [dataset.prompt(i).text for i in range(25)]
    again = PromptDataset("train", table, tokenizer, RenderSettings(), shuffle=True, seed=5)
    assert [again.prompt(i).text for i in range(25)] == first
    for epoch in range(2):
        assert sorted(first[10 * epoch : 10 * epoch + 10]) == sorted(r["prompt"] for r in ROWS)
    assert first[:10] != first[10:20], "each epoch has its own order"
    in_order = PromptDataset("train", table, tokenizer, RenderSettings(), shuffle=False)
    assert [in_order.prompt(i).text for i in range(10)] == [r["prompt"] for r in ROWS]


def test_a_prompt_carries_its_tokens_answer_and_row(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    table = read_table([write_jsonl(tmp_path / "t.jsonl", ROWS)])
    prompt = PromptDataset("train", table, tokenizer, RenderSettings()).prompt(3)
    assert prompt.text == "add 3 4=" and prompt.answer == "7" and prompt.row["level"] == 0
    assert list(prompt.token_ids) == tokenizer.encode("add 3 4=")


def test_chat_messages_use_the_chat_template(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)
    tokenizer.chat_template = CHAT_TEMPLATE
    import datasets

    rows = [{"prompt": [{"role": "user", "content": "add 1 2="}], "answer": "3"}]
    settings = RenderSettings(system_prompt="be brief")
    prompt = PromptDataset("train", datasets.Dataset.from_list(rows), tokenizer, settings).prompt(0)
    assert prompt.text == "<|system|>be brief\n<|user|>add 1 2=\n<|assistant|>"
    assert list(prompt.token_ids) == tokenizer.encode(prompt.text, add_special_tokens=False)
    wrapped = RenderSettings(apply_chat_template=True)
    strings = datasets.Dataset.from_list([{"prompt": "add 1 2=", "answer": "3"}])
    assert PromptDataset("train", strings, tokenizer, wrapped).prompt(0).text == "<|user|>add 1 2=\n<|assistant|>"


def test_messages_without_a_chat_template_are_refused(tokenizer) -> None:  # type: ignore[no-untyped-def]
    import datasets

    rows = [{"prompt": [{"role": "user", "content": "hi"}]}]
    dataset = PromptDataset("train", datasets.Dataset.from_list(rows), tokenizer, RenderSettings())
    with pytest.raises(DataError, match="chat template"):
        dataset.prompt(0)


def test_missing_prompt_column_and_long_prompts(tokenizer) -> None:  # type: ignore[no-untyped-def]
    import datasets

    table = datasets.Dataset.from_list([{"question": "add 1 2=", "answer": "3"}])
    with pytest.raises(DataError, match="no 'prompt' column"):
        PromptDataset("train", table, tokenizer, RenderSettings()).prompt(0)
    long = datasets.Dataset.from_list([{"prompt": "copy 0123456789="}])
    full = tokenizer.encode("copy 0123456789=")
    for side, expected in (("left", full[-4:]), ("right", full[:4])):
        dataset = PromptDataset("train", long, tokenizer, RenderSettings(max_prompt_length=4, truncation=side))
        assert list(dataset.prompt(0).token_ids) == expected
        assert dataset.num_truncated == 1


def test_config_splits_and_the_task_fallback(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    val = write_jsonl(tmp_path / "val.jsonl", ROWS[:3])
    config = load_config("demo", [f"data.train_files={train}", f"data.val_files=[{val}]",
                                  "reward.function=psrl.rewards.builtin:exact_match"])  # fmt: skip
    assert config.data.train_files == [str(train)]
    splits = {s: load_split(config.data, s, tokenizer, 64) for s in ("train", "val")}
    assert len(splits["train"]) == 10 and len(splits["val"]) == 3
    assert splits["val"].shuffle is False
    assert isinstance(make_task(config, tokenizer), PromptDataset)
    assert make_task(load_config("demo"), tokenizer).name == "demo_short"
