"""Sampling controls and request validation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from psrl.engine import FinishReason, SamplingParams
from psrl.errors import RequestError
from tests.engine.conftest import Checkpoint, LogitRecorder, greedy, make_engine, run_to_completion

PROMPT = [11, 22, 33, 44, 55, 66]


def _run_one(engine, params: SamplingParams, prompt: list[int] = PROMPT, request_id: str = "x"):  # type: ignore[no-untyped-def]
    engine.add_request(request_id, prompt, params)
    return run_to_completion(engine)[0][request_id]


def test_seeded_sampling_is_reproducible_whatever_else_runs(qwen2: Checkpoint) -> None:
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    alone = _run_one(make_engine(qwen2), params)
    engine = make_engine(qwen2)
    for index in range(5):
        engine.add_request(f"other{index}", [index + 1] * (index + 2), SamplingParams(max_tokens=20, ignore_eos=True))
    crowded = _run_one(engine, params)
    assert crowded.output_ids == alone.output_ids
    unseeded = [_run_one(make_engine(qwen2, seed=s), SamplingParams(max_tokens=16, ignore_eos=True)) for s in (1, 2)]
    assert unseeded[0].output_ids != unseeded[1].output_ids


def test_logprobs_are_those_of_the_temperature_scaled_distribution(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2)
    recorder = LogitRecorder()
    recorder.attach(engine)
    result = _run_one(engine, SamplingParams(max_tokens=10, temperature=0.7, seed=5, ignore_eos=True))
    reference = qwen2.reference_logits(PROMPT + result.output_ids)
    for index, token in enumerate(result.output_ids):
        expected = torch.log_softmax(reference[len(PROMPT) - 1 + index] / 0.7, dim=-1)[token].item()
        assert result.logprobs[index] == pytest.approx(expected, abs=1e-4)


def test_top_k_one_and_tiny_top_p_equal_greedy(qwen2: Checkpoint) -> None:
    want = qwen2.reference_greedy(PROMPT, 12)
    top_k = _run_one(make_engine(qwen2), SamplingParams(max_tokens=12, top_k=1, seed=3, ignore_eos=True))
    top_p = _run_one(make_engine(qwen2), SamplingParams(max_tokens=12, top_p=1e-6, seed=3, ignore_eos=True))
    assert top_k.output_ids == want and top_p.output_ids == want


def test_top_logprobs_are_sorted_and_contain_the_greedy_choice(qwen2: Checkpoint) -> None:
    result = _run_one(make_engine(qwen2), greedy(max_tokens=5, num_logprobs=3))
    assert result.top_logprobs is not None and len(result.top_logprobs) == 5
    for token, logprob, top in zip(result.output_ids, result.logprobs, result.top_logprobs, strict=True):
        assert len(top) == 3 and top[0][0] == token and top[0][1] == pytest.approx(logprob)
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)


def test_stop_tokens_and_min_tokens(qwen2: Checkpoint) -> None:
    want = qwen2.reference_greedy(PROMPT, 12)
    stop_at = want[2]
    first_stop = want.index(stop_at)
    stopped = _run_one(make_engine(qwen2), greedy(max_tokens=12, stop_token_ids=(stop_at,)))
    assert stopped.output_ids == want[: first_stop + 1] and stopped.finish_reason == FinishReason.STOP
    held = _run_one(make_engine(qwen2), greedy(max_tokens=12, stop_token_ids=(stop_at,), min_tokens=first_stop + 2))
    assert len(held.output_ids) > first_stop + 1
    assert stop_at not in held.output_ids[: first_stop + 2]


def test_eos_from_the_checkpoint_stops_unless_ignored(qwen2: Checkpoint, tmp_path: Path) -> None:
    want = qwen2.reference_greedy(PROMPT, 12)
    directory = tmp_path / "with_eos"
    shutil.copytree(qwen2.path, directory)
    config = json.loads((directory / "config.json").read_text())
    config["eos_token_id"] = want[3]
    (directory / "config.json").write_text(json.dumps(config))
    engine = make_engine(qwen2, model_path=directory)
    stopped = _run_one(engine, SamplingParams(max_tokens=12, temperature=0.0), request_id="a")
    assert stopped.output_ids == want[: want.index(want[3]) + 1] and stopped.finish_reason == FinishReason.STOP
    ignored = _run_one(engine, greedy(max_tokens=12), request_id="b")
    assert ignored.output_ids == want and ignored.finish_reason == FinishReason.LENGTH


BAD_REQUESTS = [
    ("empty prompt", [], {}),
    ("out of vocabulary", [1, 2, 97], {}),
    ("negative id", [1, -1], {}),
    ("not ints", [1, 2.5], {}),
    ("prompt longer than context", [1] * 256, {}),
    ("max_tokens zero", [1, 2], {"max_tokens": 0}),
    ("max_tokens negative", [1, 2], {"max_tokens": -3}),
    ("unknown sampling field", [1, 2], {"best_of": 2}),
    ("bad temperature", [1, 2], {"temperature": -1.0}),
    ("bad top_p", [1, 2], {"top_p": 0.0}),
]


@pytest.mark.parametrize(("case", "prompt", "sampling"), BAD_REQUESTS, ids=[case[0] for case in BAD_REQUESTS])
def test_bad_requests_fail_alone(qwen2: Checkpoint, case: str, prompt: list, sampling: dict) -> None:
    engine = make_engine(qwen2)
    engine.add_request("good", PROMPT, greedy(max_tokens=6))
    engine.step()
    with pytest.raises(RequestError) as error:
        engine.add_request("bad", prompt, sampling)
    assert error.value.request_id == "bad"
    assert engine.status().request_tokens.keys() == {"good"}
    assert run_to_completion(engine)[0]["good"].output_ids == qwen2.reference_greedy(PROMPT, 6)


def test_duplicate_ids_and_bad_continuations_are_refused(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2)
    engine.add_request("a", PROMPT, greedy(max_tokens=6))
    with pytest.raises(RequestError, match="already"):
        engine.add_request("a", PROMPT, greedy(max_tokens=6))
    with pytest.raises(RequestError, match="disagree"):
        engine.add_request("b", PROMPT, greedy(max_tokens=6), prior_output_ids=[1, 2], prior_logprobs=[0.0])
    with pytest.raises(RequestError, match="already reached"):
        engine.add_request("c", PROMPT, greedy(max_tokens=2), prior_output_ids=[1, 2])
    assert engine.status().request_tokens.keys() == {"a"}


def _sample_counts(params: SamplingParams, probs: list[float], num_rows: int) -> torch.Tensor:
    from psrl.engine.sampler import Sampler
    from psrl.engine.sequence import Sequence

    sampler = Sampler(torch.device("cpu"), eos_token_ids=(), seed=0)
    seqs = [Sequence(str(row), [1], params, arrival_index=row) for row in range(num_rows)]
    logits = torch.tensor(probs).log().expand(num_rows, -1).clone()
    result = sampler.sample(logits, seqs)
    return torch.bincount(torch.tensor(result.token_ids), minlength=len(probs)).float() / num_rows


def test_sampled_frequencies_follow_the_distribution() -> None:
    probs = [0.5, 0.25, 0.15, 0.1, 0.0]
    frequencies = _sample_counts(SamplingParams(), probs, num_rows=40_000)
    assert torch.allclose(frequencies, torch.tensor(probs), atol=0.01)
    assert frequencies[4] == 0.0


def test_top_p_and_top_k_renormalise_over_the_kept_tokens() -> None:
    probs = [0.5, 0.25, 0.15, 0.1]
    nucleus = _sample_counts(SamplingParams(top_p=0.7), probs, num_rows=30_000)
    assert torch.allclose(nucleus, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]), atol=0.015)
    top_k = _sample_counts(SamplingParams(top_k=3), probs, num_rows=30_000)
    assert torch.allclose(top_k, torch.tensor([0.5, 0.25, 0.15, 0.0]) / 0.9, atol=0.015)
