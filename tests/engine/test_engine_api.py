"""Engine API: abort and continuation, weight loading with version stamps, pause, sampling controls."""

from __future__ import annotations

import pytest
import torch

from psrl.engine import FinishReason, SamplingParams
from psrl.models import WeightLoadError
from tests.engine.conftest import Checkpoint, LogitRecorder, greedy, make_checkpoint, make_engine, run_to_completion


def _steps(engine, num: int) -> list:  # type: ignore[no-untyped-def]
    return [engine.step() for _ in range(num)]


def test_abort_returns_exactly_the_streamed_tokens_and_continuation_matches(qwen2: Checkpoint) -> None:
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    engine = make_engine(qwen2, num_kv_blocks=64)
    engine.add_request("r", prompt, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    streamed = [out for step in _steps(engine, 7) for out in step.outputs]
    aborted = engine.abort("r")
    assert aborted is not None and aborted.finish_reason == FinishReason.ABORT
    assert aborted.output_ids == [token for out in streamed for token in out.token_ids]
    assert aborted.logprobs == [lp for out in streamed for lp in out.logprobs]
    assert len(aborted.output_ids) == 7 and not engine.has_unfinished_requests()
    assert engine.abort("r") is None

    engine.add_request(
        "r",
        prompt,
        greedy(max_tokens=20),
        prior_output_ids=aborted.output_ids,
        prior_logprobs=aborted.logprobs,
        prior_versions=aborted.versions,
    )
    continued = run_to_completion(engine)[0]["r"]
    assert continued.output_ids == qwen2.reference_greedy(prompt, 20)
    assert continued.output_ids[:7] == aborted.output_ids and continued.logprobs[:7] == aborted.logprobs
    assert continued.num_prior_outputs == 7 and continued.finish_reason == FinishReason.LENGTH


def test_abort_of_a_waiting_request_returns_nothing_generated(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64)
    engine.add_request("w", [1, 2, 3], greedy(max_tokens=4))
    result = engine.abort("w")
    assert result is not None and result.output_ids == [] and result.prompt_ids == [1, 2, 3]
    assert engine.status().num_kv_blocks_used == 0


def test_new_weights_change_outputs_from_the_next_step_with_version_stamps(
    qwen2: Checkpoint, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = make_checkpoint("qwen2_tied", tmp_path_factory.mktemp("qwen2_other"), seed=1)
    prompt = [7, 1, 8, 2, 8, 1, 8, 2, 8]
    engine = make_engine(qwen2, num_kv_blocks=64)
    engine.add_request("r", prompt, greedy(max_tokens=12))
    before = [out.token_ids[0] for step in _steps(engine, 5) for out in step.outputs]
    num_loaded = engine.load_weights(other.model.state_dict(), version=1)
    assert num_loaded == len(other.model.state_dict())
    result = run_to_completion(engine)[0]["r"]
    assert result.versions == [0] * 5 + [1] * 7
    assert result.output_ids[:5] == before == qwen2.reference_greedy(prompt, 5)
    assert result.output_ids != qwen2.reference_greedy(prompt, 12)
    # a request that starts after the load is computed entirely with the new weights
    recorder = LogitRecorder()
    recorder.attach(engine)
    engine.add_request("new", prompt, greedy(max_tokens=6))
    fresh = run_to_completion(engine)[0]["new"]
    assert fresh.output_ids == other.reference_greedy(prompt, 6) and fresh.versions == [1] * 6
    assert recorder.max_error(other, "new", prompt + fresh.output_ids) < 1e-4


def test_weights_from_an_iterator_in_another_dtype_are_cast(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64)
    named = ((name, tensor.to(torch.bfloat16)) for name, tensor in qwen2.model.state_dict().items())
    engine.load_weights(named, version=3)
    weight = engine.runner.model.embed_tokens.weight
    assert weight.dtype == torch.float32
    expected = qwen2.model.state_dict()["model.embed_tokens.weight"].to(torch.bfloat16).float()
    assert torch.equal(weight, expected) and engine.status().weight_version == 3


def test_bad_weight_update_changes_nothing(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64)
    state = qwen2.model.state_dict()
    before = engine.runner.model.norm.clone()
    with pytest.raises(WeightLoadError, match="not a parameter"):
        engine.load_weights({"model.norm.weight": state["model.norm.weight"] * 2, "model.bogus": before}, version=1)
    bad_shape = {"model.norm.weight": state["model.norm.weight"] * 2, "model.layers.0.mlp.up_proj.weight": before}
    with pytest.raises(WeightLoadError, match="shape"):
        engine.load_weights(bad_shape, version=1)
    assert torch.equal(engine.runner.model.norm, before) and engine.status().weight_version == 0


def test_weight_load_resets_the_prefix_cache(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64)
    prompt = list(range(1, 20))
    engine.add_request("a", prompt, greedy(max_tokens=2))
    run_to_completion(engine)
    engine.load_weights(qwen2.model.state_dict(), version=1)
    engine.add_request("b", prompt, greedy(max_tokens=2))
    run_to_completion(engine)
    assert engine.status().num_prefix_hit_tokens == 0
    engine.add_request("c", prompt, greedy(max_tokens=2))
    run_to_completion(engine)
    assert engine.status().num_prefix_hit_tokens == 16


def test_pause_stops_stepping_and_resume_continues(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64)
    engine.add_request("r", [5, 6, 7], greedy(max_tokens=6))
    engine.step()
    engine.pause()
    assert [engine.step().outputs for _ in range(3)] == [[], [], []]
    assert engine.status().is_paused and engine.status().num_running == 1
    engine.resume()
    result = run_to_completion(engine)[0]["r"]
    assert result.output_ids == qwen2.reference_greedy([5, 6, 7], 6)


def test_status_reports_queues_kv_and_throughput(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64, max_num_seqs=2)
    for index in range(3):
        engine.add_request(str(index), [1 + index] * 9, greedy(max_tokens=30))
    _steps(engine, 3)  # one prefill step, two decode steps: 3 outputs each for requests 0 and 1
    status = engine.status()
    assert (status.num_running, status.num_waiting) == (2, 1)
    # 12 tokens each, of which the newest has no keys/values yet; 12 tokens need 3 blocks of 4
    assert status.num_kv_tokens == 2 * 11
    assert status.num_kv_blocks_used == 2 * 3 and status.num_kv_blocks_total == 64
    assert status.request_tokens == {"0": (9, 3), "1": (9, 3), "2": (9, 0)}
    assert status.num_generated_tokens_total == 6 and status.tokens_per_s > 0
