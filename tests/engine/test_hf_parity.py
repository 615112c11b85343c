"""The engine against transformers on random Qwen2 / Qwen3 / Llama (3.x rope) checkpoints, fp32.

Every logits row the engine computes (prefill and each decode step) must be within 1e-4 of a plain
full-sequence transformers forward, and greedy outputs must match token for token, also through
chunked prefill, prefix-cache hits and preemption.
"""

from __future__ import annotations

import random

import pytest

from tests.engine.conftest import Checkpoint, LogitRecorder, greedy, make_engine, run_to_completion

TOLERANCE = 1e-4


def _prompts(num: int, seed: int, min_len: int = 3, max_len: int = 30) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 97) for _ in range(rng.randint(min_len, max_len))] for _ in range(num)]


def _check_all(checkpoint: Checkpoint, recorder: LogitRecorder, prompts: list[list[int]], results: dict) -> None:
    for index, prompt in enumerate(prompts):
        result = results[str(index)]
        assert result.output_ids == checkpoint.reference_greedy(prompt, len(result.output_ids)), f"request {index}"
        error = recorder.max_error(checkpoint, str(index), prompt + result.output_ids)
        assert error < TOLERANCE, f"request {index}: max logit error {error}"


@pytest.mark.parametrize("mode", ["fused_cpu", "dense"])
def test_batched_greedy_matches_transformers(checkpoint: Checkpoint, mode: str, request: pytest.FixtureRequest) -> None:
    if mode == "fused_cpu":
        request.getfixturevalue("cpu_kernels")
    engine = make_engine(checkpoint, num_kv_blocks=128, **DECODE_MODES[mode])
    assert engine.runner.decode_path == mode
    _run_batched_greedy(checkpoint, engine)


def test_default_cpu_decode_is_fused(qwen2: Checkpoint, cpu_kernels: object) -> None:
    # the parity tests below would pass on the eager path too; this one pins which path they cover
    assert make_engine(qwen2, num_kv_blocks=16).runner.decode_path == "fused_cpu"


@pytest.mark.parametrize("mode", ["dense", "gather", "bucketed"])
def test_other_decode_paths_match_transformers(qwen2: Checkpoint, mode: str) -> None:
    overrides = {"bucketed": {"max_num_seqs": 8}}.get(mode, {})
    engine = make_engine(qwen2, num_kv_blocks=128, **DECODE_MODES[mode], **overrides)
    assert engine.runner.decode_path == mode
    _run_batched_greedy(qwen2, engine)


def _run_batched_greedy(checkpoint: Checkpoint, engine) -> None:  # type: ignore[no-untyped-def]
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompts = _prompts(6, seed=1)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, greedy(max_tokens=8 + index * 3))
    results, _ = run_to_completion(engine)
    _check_all(checkpoint, recorder, prompts, results)


def test_chunked_prefill_matches_transformers(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=128, max_num_batched_tokens=7)
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompts = _prompts(4, seed=2, min_len=15, max_len=40)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, greedy(max_tokens=6))
    results, steps = run_to_completion(engine)
    assert max(step.num_computed_tokens for step in steps) <= 7
    _check_all(qwen2, recorder, prompts, results)


def test_prefix_cache_hits_match_transformers(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=128)
    recorder = LogitRecorder()
    recorder.attach(engine)
    shared = _prompts(1, seed=3, min_len=18, max_len=18)[0]
    prompts = [[*shared, 5, 6, 7], [*shared, 9], shared[:13], [*shared, 5, 6, 7]]
    engine.add_request("0", prompts[0], greedy(max_tokens=5))
    results, _ = run_to_completion(engine)
    for index, prompt in enumerate(prompts[1:], start=1):
        engine.add_request(str(index), prompt, greedy(max_tokens=5))
    results.update(run_to_completion(engine)[0])
    # blocks of 4 tokens; the block holding a prompt's last token is always recomputed:
    # 16 of 19 tokens, 12 of 13, and 20 of 21 (request 0's generated tokens are not in its prompt)
    assert engine.status().num_prefix_hit_tokens == 16 + 12 + 20
    _check_all(qwen2, recorder, prompts, results)


DECODE_MODES: dict[str, dict[str, object]] = {
    "fused_cpu": {},  # the default on CPU/fp32: fused C kernels over the head-major workspace
    "dense": {"cpu_kernels": "off"},  # eager torch: keys from the dense decode workspace
    "gather": {"dense_decode": False},  # keys gathered from the blocks each step
    "bucketed": {"bucketed_decode": True},  # the fixed shapes CUDA graphs replay
}


@pytest.mark.parametrize("mode", sorted(DECODE_MODES))
def test_preemption_matches_transformers(qwen2: Checkpoint, mode: str, request: pytest.FixtureRequest) -> None:
    if mode == "fused_cpu":
        request.getfixturevalue("cpu_kernels")
    # 24 blocks of 4 tokens cannot hold 8 sequences of ~30 tokens: decode must preempt
    engine = make_engine(qwen2, num_kv_blocks=24, **DECODE_MODES[mode])
    assert engine.runner.decode_path == mode
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompts = _prompts(8, seed=4, min_len=6, max_len=14)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, greedy(max_tokens=20))
    results, _ = run_to_completion(engine)
    assert engine.status().num_preemptions_total > 0
    assert sum(result.num_preemptions for result in results.values()) == engine.status().num_preemptions_total
    _check_all(qwen2, recorder, prompts, results)


def test_sequences_longer_than_the_first_workspace_match_transformers(cpu_kernels: object) -> None:
    # the decode workspace starts with room for 256 positions and grows while rows are decoding
    from transformers import AutoModelForCausalLM

    from psrl.engine import DEMO_MODEL_DIR
    from psrl.engine.decode_workspace import INITIAL_CAPACITY

    demo = Checkpoint("demo", DEMO_MODEL_DIR, AutoModelForCausalLM.from_pretrained(DEMO_MODEL_DIR).eval())
    engine = make_engine(demo, block_size=16, num_kv_blocks=64)
    assert engine.runner.decode_path == "fused_cpu"
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, greedy(max_tokens=300 - 40 * index))
    results, _ = run_to_completion(engine)
    assert engine.runner.fused_workspace is not None
    assert engine.runner.fused_workspace.capacity > INITIAL_CAPACITY
    for index, prompt in enumerate(prompts):
        error = recorder.max_error(demo, str(index), prompt + results[str(index)].output_ids)
        assert error < TOLERANCE, f"request {index}: max logit error {error}"
