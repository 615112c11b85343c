"""The shipped demo model: loadable by transformers and by the engine, small, and imperfect."""

from __future__ import annotations

import pytest

from psrl.engine import DEMO_MODEL_DIR, Engine, EngineArgs, SamplingParams
from psrl.tasks import DemoTask


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)


def test_asset_is_complete_and_small() -> None:
    names = {path.name for path in DEMO_MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert (DEMO_MODEL_DIR / "model.safetensors").stat().st_size < 10_000_000


def test_tokenizer_round_trips_every_prompt_and_answer(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from transformers import PreTrainedTokenizerFast

    plain = PreTrainedTokenizerFast.from_pretrained(DEMO_MODEL_DIR)
    task = DemoTask(seed=5)
    for index in range(200):
        prompt = task.prompt(index)
        for text in (prompt.text, prompt.answer):
            ids = tokenizer.encode(text)
            assert len(ids) == len(text) and tokenizer.unk_token_id not in ids  # one token per character
            assert plain.encode(text) == ids  # whichever class transformers picks, the ids agree
            assert tokenizer.decode(ids) == text
    assert tokenizer.decode([*tokenizer.encode("12"), tokenizer.eos_token_id], skip_special_tokens=True) == "12"


def _mean_reward(tokenizer, temperature: float, num: int) -> float:  # type: ignore[no-untyped-def]
    task = DemoTask(seed=123)
    engine = Engine(EngineArgs(model_path=DEMO_MODEL_DIR, device="cpu", dtype="float32", num_kv_blocks=256))
    prompts = [task.prompt(index) for index in range(num)]
    for prompt in prompts:
        params = SamplingParams(max_tokens=160, temperature=temperature, seed=prompt.index)
        engine.add_request(str(prompt.index), tokenizer.encode(prompt.text), params)
    texts = {}
    while engine.has_unfinished_requests():
        for result in engine.step().finished:
            texts[result.request_id] = tokenizer.decode(result.output_ids, skip_special_tokens=True)
    return sum(task.reward(p, texts[str(p.index)]).score for p in prompts) / num


def test_engine_serves_the_demo_model(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert 0.0 < _mean_reward(tokenizer, temperature=0.0, num=16) < 1.0


@pytest.mark.slow
def test_demo_model_is_imperfect_with_room_to_improve(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert 0.15 <= _mean_reward(tokenizer, temperature=1.0, num=128) <= 0.6
