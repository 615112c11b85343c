"""Decode rounds (several steps per scheduling round, sampled on the device) against transformers.

Every test runs with the torch reference kernels on the CPU (`gpu_kernels=torch`) and, where a
GPU is present, with the Triton kernels and CUDA graphs in fp32 (`gpu` marker). Outputs must match
transformers' greedy decoding token for token and every log-probability must be within 1e-4 of a
full-sequence transformers forward, through prefix-cache hits, preemption, abort and continuation,
weight loads, and stop tokens or length limits in the middle of a round.
"""

from __future__ import annotations

import random

import pytest
import torch

from psrl.engine import FinishReason, SamplingParams
from psrl.engine.decode_rounds import round_buckets
from tests.engine.conftest import Checkpoint, greedy, make_checkpoint, make_engine, run_to_completion

TOLERANCE = 1e-4
ROUND_MODES = [
    pytest.param({"gpu_kernels": "torch"}, id="torch_cpu"),
    pytest.param(
        {"gpu_kernels": "on", "device": "cuda"},
        id="triton_cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
    ),
]


@pytest.fixture(params=ROUND_MODES)
def mode(request: pytest.FixtureRequest) -> dict[str, object]:
    return dict(request.param, decode_steps=4)


def _prompts(num: int, seed: int, min_len: int = 3, max_len: int = 30) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 97) for _ in range(rng.randint(min_len, max_len))] for _ in range(num)]


def check_against_reference(checkpoint: Checkpoint, prompt: list[int], result, temperature: float = 1.0) -> None:  # type: ignore[no-untyped-def]
    """Every kept token's log-probability within TOLERANCE of a full transformers forward."""
    reference = torch.log_softmax(checkpoint.reference_logits(prompt + result.output_ids) / temperature, dim=-1)
    first = len(prompt) - 1
    for index, (token, logprob) in enumerate(zip(result.output_ids, result.logprobs, strict=True)):
        if index < result.num_prior_outputs:
            continue
        assert abs(logprob - reference[first + index, token].item()) < TOLERANCE, (result.request_id, index)


def _check_greedy(checkpoint: Checkpoint, prompts: list[list[int]], results: dict) -> None:
    for index, prompt in enumerate(prompts):
        result = results[str(index)]
        assert result.output_ids == checkpoint.reference_greedy(prompt, len(result.output_ids)), index
        check_against_reference(checkpoint, prompt, result)


def test_buckets_cover_every_batch_up_to_the_limit() -> None:
    assert round_buckets(100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]
    assert round_buckets(512)[-4:] == [320, 384, 448, 512] and round_buckets(1) == [1]


def test_rounds_match_transformers_and_stop_at_their_limits(qwen2: Checkpoint, mode: dict) -> None:
    engine = make_engine(qwen2, num_kv_blocks=128, **mode)
    assert engine.runner.decode_path.endswith("rounds")
    prompts = _prompts(6, seed=1)
    for index, prompt in enumerate(prompts):  # lengths end inside rounds of 4
        engine.add_request(str(index), prompt, greedy(max_tokens=5 + 3 * index))
    results, steps = run_to_completion(engine)
    _check_greedy(qwen2, prompts, results)
    assert all(len(results[str(i)].output_ids) == 5 + 3 * i for i in range(6))
    assert max(len(out.token_ids) for step in steps for out in step.outputs) == 4
    assert engine.status().num_kv_blocks_used == 0


def test_context_limit_ends_a_round_early(qwen2: Checkpoint, mode: dict) -> None:
    engine = make_engine(qwen2, num_kv_blocks=64, max_model_len=23, **mode)
    prompt = _prompts(1, seed=9, min_len=10, max_len=10)[0]
    engine.add_request("r", prompt, greedy(max_tokens=100))
    result = run_to_completion(engine)[0]["r"]
    assert len(prompt) + len(result.output_ids) == 23 and result.finish_reason == FinishReason.LENGTH
    _check_greedy(qwen2, [prompt], {"0": result})


def test_stop_token_inside_a_round_truncates_the_round(qwen2: Checkpoint, mode: dict) -> None:
    prompt = _prompts(1, seed=5, min_len=8, max_len=8)[0]
    want = qwen2.reference_greedy(prompt, 12)
    stop = want[6]
    engine = make_engine(qwen2, num_kv_blocks=64, **mode)
    engine.add_request("r", prompt, greedy(max_tokens=12, stop_token_ids=[stop]))
    result = run_to_completion(engine)[0]["r"]
    assert result.output_ids == want[: want.index(stop) + 1] and result.finish_reason == FinishReason.STOP
    assert engine.status().num_kv_blocks_used == 0


def test_prefix_cache_hits_through_rounds(qwen2: Checkpoint, mode: dict) -> None:
    engine = make_engine(qwen2, num_kv_blocks=128, **mode)
    shared = _prompts(1, seed=3, min_len=18, max_len=18)[0]
    prompts = [[*shared, 5, 6, 7], [*shared, 9], shared[:13], [*shared, 5, 6, 7]]
    engine.add_request("0", prompts[0], greedy(max_tokens=9))
    results, _ = run_to_completion(engine)
    for index, prompt in enumerate(prompts[1:], start=1):
        engine.add_request(str(index), prompt, greedy(max_tokens=9))
    results.update(run_to_completion(engine)[0])
    assert engine.status().num_prefix_hit_tokens == 16 + 12 + 20
    _check_greedy(qwen2, prompts, results)


def test_preemption_through_rounds(qwen2: Checkpoint, mode: dict) -> None:
    # 24 blocks of 4 tokens cannot hold 8 sequences of ~30 tokens: rounds shrink to one step and preempt
    engine = make_engine(qwen2, num_kv_blocks=24, **mode)
    prompts = _prompts(8, seed=4, min_len=6, max_len=14)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, greedy(max_tokens=20))
    results, _ = run_to_completion(engine)
    assert engine.status().num_preemptions_total > 0
    _check_greedy(qwen2, prompts, results)
    assert engine.status().num_kv_blocks_used == 0


def test_abort_mid_generation_and_continue(qwen2: Checkpoint, mode: dict) -> None:
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    engine = make_engine(qwen2, num_kv_blocks=64, **mode)
    engine.add_request("r", prompt, greedy(max_tokens=24))
    streamed = [out for _ in range(3) for out in engine.step().outputs]
    aborted = engine.abort("r")
    assert aborted is not None and aborted.finish_reason == FinishReason.ABORT
    assert aborted.output_ids == [token for out in streamed for token in out.token_ids]
    assert len(aborted.output_ids) == 1 + 4 + 4  # the prefill's token, then two rounds
    engine.add_request("r", prompt, greedy(max_tokens=24), prior_output_ids=aborted.output_ids,
                       prior_logprobs=aborted.logprobs, prior_versions=aborted.versions)  # fmt: skip
    continued = run_to_completion(engine)[0]["r"]
    assert continued.output_ids == qwen2.reference_greedy(prompt, 24)
    assert continued.logprobs[:9] == aborted.logprobs
    check_against_reference(qwen2, prompt, continued)


def test_weights_loaded_between_rounds_apply_to_the_next_round(
    qwen2: Checkpoint, mode: dict, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = make_checkpoint("qwen2_tied", tmp_path_factory.mktemp("qwen2_rounds_other"), seed=1)
    prompt = [7, 1, 8, 2, 8, 1, 8, 2, 8]
    engine = make_engine(qwen2, num_kv_blocks=64, **mode)
    engine.add_request("r", prompt, greedy(max_tokens=13))
    for _ in range(2):
        engine.step()  # prefill (1 token) and one round (4)
    engine.load_weights(other.model.state_dict(), version=1)
    result = run_to_completion(engine)[0]["r"]
    assert result.versions == [0] * 5 + [1] * 8
    assert result.output_ids[:5] == qwen2.reference_greedy(prompt, 5)
    engine.add_request("new", prompt, greedy(max_tokens=6))
    fresh = run_to_completion(engine)[0]["new"]
    assert fresh.output_ids == other.reference_greedy(prompt, 6)
    check_against_reference(other, prompt, fresh)


def test_seeded_draws_depend_only_on_seed_and_position(qwen2: Checkpoint, mode: dict) -> None:
    params = SamplingParams(max_tokens=14, temperature=0.8, seed=1234, ignore_eos=True)
    prompt = [11, 22, 33, 44, 55, 66]
    runs = []
    for steps, crowd in ((1, 0), (4, 0), (3, 5)):
        engine = make_engine(qwen2, num_kv_blocks=128, **{**mode, "decode_steps": steps})
        for index in range(crowd):
            engine.add_request(
                f"other{index}", [index + 1] * (index + 2), SamplingParams(max_tokens=20, ignore_eos=True)
            )
        engine.add_request("x", prompt, params)
        runs.append(run_to_completion(engine)[0]["x"])
    assert runs[0].output_ids == runs[1].output_ids == runs[2].output_ids
    check_against_reference(qwen2, prompt, runs[1], temperature=0.8)


def test_requests_the_device_sampler_does_not_cover_decode_one_step_at_a_time(qwen2: Checkpoint, mode: dict) -> None:
    engine = make_engine(qwen2, num_kv_blocks=128, **mode)
    prompts = _prompts(3, seed=6)
    for index, prompt in enumerate(prompts[:2]):
        engine.add_request(str(index), prompt, greedy(max_tokens=10))
    engine.add_request("2", prompts[2], greedy(max_tokens=3, num_logprobs=2))  # top log-probs: host sampler
    results, steps = run_to_completion(engine)
    _check_greedy(qwen2, prompts, results)
    assert results["2"].top_logprobs is not None and len(results["2"].top_logprobs) == 3
    per_step = [max(len(out.token_ids) for out in step.outputs) for step in steps if step.outputs]
    assert per_step[:3] == [1, 1, 1] and max(per_step) == 4  # one step at a time while it runs, rounds after


def test_counter_draws_follow_the_distribution() -> None:
    from psrl.models.reference_step import TorchStepKernels

    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    rows = 40_000
    tokens, logprobs = torch.empty(rows, dtype=torch.int64), torch.empty(rows)
    seeds = torch.tensor([[7] * rows, [0] * rows], dtype=torch.int32)
    TorchStepKernels().sample(
        probs.log().expand(rows, -1), torch.ones(rows), seeds, torch.arange(rows), tokens, logprobs
    )
    frequencies = torch.bincount(tokens, minlength=5).float() / rows
    assert torch.allclose(frequencies, probs, atol=0.01) and frequencies[4] == 0.0
    assert torch.allclose(logprobs, probs.log()[tokens], atol=1e-6)


def test_rounds_without_graphs_leave_nothing_to_capture_when_idle(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, gpu_kernels="torch", decode_steps=4, capture_graphs_when_idle=True)
    assert engine.runner.rounds is not None and not engine.runner.rounds.use_graphs  # the CPU: no graphs
    assert not engine.capture_when_idle()
    assert not engine.runner.rounds.capture_next()
