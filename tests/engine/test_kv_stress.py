"""KV exhaustion under load: preemption and resumption lose and corrupt nothing."""

from __future__ import annotations

import random

import pytest

from psrl.engine import FinishReason
from tests.engine.conftest import Checkpoint, greedy, make_engine, run_to_completion


def _workload(seed: int, num: int) -> list[tuple[str, list[int], int]]:
    rng = random.Random(seed)
    return [
        (f"r{index}", [rng.randrange(1, 97) for _ in range(rng.randint(1, 25))], rng.randint(1, 40))
        for index in range(num)
    ]


@pytest.mark.parametrize("seed", [0, 1])
def test_tiny_kv_cache_preempts_and_every_request_completes_intact(qwen2: Checkpoint, seed: int) -> None:
    workload = _workload(seed, num=24)
    reference_engine = make_engine(qwen2, num_kv_blocks=512)
    for request_id, prompt, max_tokens in workload:
        reference_engine.add_request(request_id, prompt, greedy(max_tokens))
    expected, _ = run_to_completion(reference_engine)

    # 20 blocks x 4 tokens: a handful of sequences at a time; requests arrive while others run
    engine = make_engine(qwen2, num_kv_blocks=20, max_num_batched_tokens=16)
    rng = random.Random(seed)
    pending = list(workload)
    results = {}
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 3)):
            if pending:
                request_id, prompt, max_tokens = pending.pop(0)
                engine.add_request(request_id, prompt, greedy(max_tokens))
        out = engine.step()
        results.update((result.request_id, result) for result in out.finished)
        status = engine.status()
        assert status.num_kv_blocks_used <= 20
    assert engine.status().num_preemptions_total > 0
    assert set(results) == {request_id for request_id, _, _ in workload}
    for request_id, _, max_tokens in workload:
        got, want = results[request_id], expected[request_id]
        assert got.output_ids == want.output_ids and len(got.output_ids) == max_tokens, request_id
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4), request_id
        assert got.finish_reason == FinishReason.LENGTH
    assert engine.status().num_kv_blocks_used == 0


def test_aborts_under_memory_pressure_free_their_blocks(qwen2: Checkpoint) -> None:
    engine = make_engine(qwen2, num_kv_blocks=12)
    for request_id, prompt, _ in _workload(5, num=10):
        engine.add_request(request_id, prompt, greedy(30))
    for _ in range(15):
        engine.step()
    aborted = engine.abort_all()
    assert len(aborted) == 10 and all(result.finish_reason == FinishReason.ABORT for result in aborted)
    assert engine.status().num_kv_blocks_used == 0 and not engine.has_unfinished_requests()
