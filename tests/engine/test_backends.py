"""The rollout engine contract, run against both backends (embedded, and vLLM: marker `vllm`, `make test-vllm`).

Every check compares with transformers on the same weights, or with the backend's own
uninterrupted run; nothing here knows how a backend works inside. The model is small but has the
shapes vLLM's CPU attention supports (head size 64, KV blocks of 32 tokens).

Log-prob tolerance: both backends compute fp32 logits with kernels of their own (blocked GEMMs,
paged attention, fused norms), which round differently from transformers' eager fp32 forward.
The largest differences measured: 1.0e-5 (vLLM) and 2.2e-5 (embedded, fused CPU kernels) over 96
greedy and sampled tokens of the small model; 4.1e-5 (vLLM) and 2.0e-5 (embedded) over about 280
tokens of SmolLM2-135M-Instruct (30 layers). The tests allow 2e-4: five times the worst rounding
noise seen, and far below anything a trainer's importance ratio would notice (exp(2e-4) - 1 =
0.02%); a wrong temperature, position or weight version moves log-probs by 1e-2 or more.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from psrl.engine import Engine, EngineArgs, FinishReason, RolloutEngine, SamplingParams
from psrl.errors import RequestError
from psrl.models import WeightLoadError
from tests.engine.conftest import Checkpoint, greedy, run_to_completion

LOGPROB_TOLERANCE = 2e-4
BLOCK = 32
SHAPE: dict[str, Any] = dict(
    vocab_size=97,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=512,
    initializer_range=0.2,  # well-separated logits: greedy choices are not decided by float noise
    eos_token_id=None,
    tie_word_embeddings=True,
)
BACKENDS = ["embedded", pytest.param("vllm", marks=pytest.mark.vllm)]


def make_model(directory: Path, seed: int) -> Checkpoint:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).eval()
    model.save_pretrained(directory)
    return Checkpoint("qwen2_h64", directory, model)


def build(backend: str, model_dir: Path, **overrides: Any) -> RolloutEngine:
    values: dict[str, Any] = dict(model_path=model_dir, dtype="float32", device="cpu", block_size=BLOCK,
                                  num_kv_blocks=64, max_num_seqs=8)  # fmt: skip
    values.update(overrides)
    if backend == "embedded":
        return Engine(EngineArgs(**values))
    from psrl.engine.vllm_backend import VllmEngine, VllmEngineArgs, vllm_unavailable

    missing = vllm_unavailable()
    if missing is not None:
        pytest.skip("{}: {}".format(*missing))
    return VllmEngine(VllmEngineArgs(**values))


def close(engine: RolloutEngine) -> None:
    shutdown = getattr(engine, "shutdown", None)
    if shutdown is not None:
        shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return make_model(tmp_path_factory.mktemp("reference"), seed=0)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return make_model(tmp_path_factory.mktemp("other"), seed=1)


@pytest.fixture(scope="module", params=BACKENDS)
def shared(request: pytest.FixtureRequest, reference: Checkpoint) -> Iterator[RolloutEngine]:
    engine = build(request.param, reference.path)
    yield engine
    close(engine)


@pytest.fixture
def engine(shared: RolloutEngine, reference: Checkpoint) -> Iterator[RolloutEngine]:
    """The module's engine, handed back clean: running, empty, on the reference weights at version 0."""
    yield shared
    shared.resume()
    for request_id in list(shared.status().request_tokens):
        shared.abort(request_id)
    if shared.weight_version != 0:
        shared.load_weights(load_file(str(reference.path / "model.safetensors")), version=0)


def step_until_tokens(engine: RolloutEngine, request_id: str, num_tokens: int) -> list[int]:
    streamed: list[int] = []
    while len(streamed) < num_tokens:
        streamed += [t for out in engine.step().outputs if out.request_id == request_id for t in out.token_ids]
    return streamed


def scored_logprobs(
    checkpoint: Checkpoint, prompt: list[int], output: list[int], temperature: float = 1.0
) -> list[float]:
    """transformers' log-probs of `output` after `prompt`, under the temperature-scaled distribution."""
    logits = checkpoint.reference_logits(prompt + output) / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[len(prompt) - 1 + i, token].item() for i, token in enumerate(output)]


PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79], [7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5], list(range(1, 40))]


def test_greedy_matches_transformers_with_agreeing_logprobs(engine: RolloutEngine, reference: Checkpoint) -> None:
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(str(index), prompt, greedy(max_tokens=16))
    results, steps = run_to_completion(engine)
    for index, prompt in enumerate(PROMPTS):
        result = results[str(index)]
        assert result.output_ids == reference.reference_greedy(prompt, 16)
        assert result.finish_reason == FinishReason.LENGTH and result.versions == [0] * 16
        assert result.logprobs == pytest.approx(scored_logprobs(reference, prompt, result.output_ids),
                                                abs=LOGPROB_TOLERANCE)  # fmt: skip
        streamed = [t for step in steps for out in step.outputs if out.request_id == str(index) for t in out.token_ids]
        assert streamed == result.output_ids


def test_sampled_logprobs_are_under_the_temperature_scaled_distribution(
    engine: RolloutEngine, reference: Checkpoint
) -> None:
    prompt = PROMPTS[1]
    engine.add_request("hot", prompt, SamplingParams(max_tokens=24, temperature=0.7, seed=11, ignore_eos=True))
    result = run_to_completion(engine)[0]["hot"]
    assert len(result.output_ids) == 24
    expected = scored_logprobs(reference, prompt, result.output_ids, temperature=0.7)
    assert result.logprobs == pytest.approx(expected, abs=LOGPROB_TOLERANCE)


def test_top_logprobs_are_the_most_likely_tokens(engine: RolloutEngine, reference: Checkpoint) -> None:
    prompt = PROMPTS[0]
    engine.add_request("top", prompt, greedy(max_tokens=6, num_logprobs=3))
    result = run_to_completion(engine)[0]["top"]
    assert result.top_logprobs is not None and len(result.top_logprobs) == 6
    logprobs = torch.log_softmax(reference.reference_logits(prompt + result.output_ids), dim=-1)
    for position, top in enumerate(result.top_logprobs):
        values, tokens = logprobs[len(prompt) - 1 + position].topk(3)
        assert [token for token, _ in top] == tokens.tolist()
        assert [lp for _, lp in top] == pytest.approx(values.tolist(), abs=LOGPROB_TOLERANCE)
        assert top[0][0] == result.output_ids[position]


def test_abort_returns_exactly_the_streamed_tokens_and_continuation_matches(
    engine: RolloutEngine, reference: Checkpoint
) -> None:
    prompt = PROMPTS[0]
    engine.add_request("r", prompt, greedy(max_tokens=20))
    streamed = step_until_tokens(engine, "r", 7)
    aborted = engine.abort("r")
    assert aborted is not None and aborted.finish_reason == FinishReason.ABORT
    assert aborted.output_ids == streamed and len(aborted.logprobs) == len(streamed)
    assert not engine.has_unfinished_requests() and engine.abort("r") is None
    engine.add_request("r", prompt, greedy(max_tokens=20), prior_output_ids=aborted.output_ids,
                       prior_logprobs=aborted.logprobs, prior_versions=aborted.versions)  # fmt: skip
    continued = run_to_completion(engine)[0]["r"]
    assert continued.output_ids == reference.reference_greedy(prompt, 20)
    n = len(streamed)
    assert continued.output_ids[:n] == aborted.output_ids and continued.logprobs[:n] == aborted.logprobs
    assert continued.num_prior_outputs == n and continued.finish_reason == FinishReason.LENGTH
    assert continued.logprobs == pytest.approx(scored_logprobs(reference, prompt, continued.output_ids),
                                               abs=LOGPROB_TOLERANCE)  # fmt: skip


def test_abort_of_a_waiting_request_returns_nothing_generated(engine: RolloutEngine) -> None:
    engine.add_request("w", [1, 2, 3], greedy(max_tokens=4))
    result = engine.abort("w")
    assert result is not None and result.output_ids == [] and result.prompt_ids == [1, 2, 3]
    assert engine.status().num_kv_blocks_used == 0 and not engine.has_unfinished_requests()


def test_new_weights_change_outputs_from_the_next_step_with_version_stamps(
    engine: RolloutEngine, reference: Checkpoint, other: Checkpoint
) -> None:
    prompt = PROMPTS[1]
    engine.add_request("r", prompt, greedy(max_tokens=12))
    before = step_until_tokens(engine, "r", 5)
    assert engine.load_weights(other.model.state_dict(), version=1) == len(other.model.state_dict())
    result = run_to_completion(engine)[0]["r"]
    assert result.output_ids[:5] == before == reference.reference_greedy(prompt, 5)
    assert result.versions == [0] * 5 + [1] * 7
    assert result.output_ids != reference.reference_greedy(prompt, 12)
    engine.add_request("new", prompt, greedy(max_tokens=8))
    fresh = run_to_completion(engine)[0]["new"]
    assert fresh.output_ids == other.reference_greedy(prompt, 8) and fresh.versions == [1] * 8
    assert fresh.logprobs == pytest.approx(scored_logprobs(other, prompt, fresh.output_ids), abs=LOGPROB_TOLERANCE)
    assert engine.status().weight_version == 1


def test_a_bad_weight_update_changes_nothing(engine: RolloutEngine, reference: Checkpoint, other: Checkpoint) -> None:
    state = dict(other.model.state_dict())
    unknown = {**state, "model.bogus.weight": torch.zeros(3)}
    with pytest.raises(WeightLoadError, match=r"model\.bogus\.weight"):
        engine.load_weights(unknown, version=1)
    bad_shape = {**state, "model.norm.weight": torch.zeros(7)}
    with pytest.raises(WeightLoadError, match="shape"):
        engine.load_weights(bad_shape, version=1)
    engine.add_request("after", PROMPTS[0], greedy(max_tokens=8))
    result = run_to_completion(engine)[0]["after"]
    assert result.output_ids == reference.reference_greedy(PROMPTS[0], 8) and result.versions == [0] * 8


def test_a_weight_load_resets_the_prefix_cache(engine: RolloutEngine, reference: Checkpoint) -> None:
    prompt = list(range(1, 71))  # two full blocks of 32, and more
    engine.add_request("a", prompt, greedy(max_tokens=2))
    run_to_completion(engine)
    engine.load_weights(load_file(str(reference.path / "model.safetensors")), version=1)
    engine.add_request("b", prompt, greedy(max_tokens=2))
    run_to_completion(engine)
    assert engine.status().num_prefix_hit_tokens == 0
    engine.add_request("c", prompt, greedy(max_tokens=2))
    run_to_completion(engine)
    status = engine.status()
    assert status.num_prefix_hit_tokens == 2 * BLOCK and 0 < status.prefix_hit_rate < 1


def test_pause_stops_stepping_and_resume_continues(engine: RolloutEngine, reference: Checkpoint) -> None:
    engine.add_request("r", [5, 6, 7], greedy(max_tokens=6))
    step_until_tokens(engine, "r", 1)
    engine.pause()
    assert [engine.step().outputs for _ in range(3)] == [[], [], []]
    status = engine.status()
    assert status.is_paused and status.request_tokens["r"][1] >= 1
    engine.resume()
    assert run_to_completion(engine)[0]["r"].output_ids == reference.reference_greedy([5, 6, 7], 6)


@pytest.mark.parametrize(
    ("prompt", "sampling", "prior", "match"),
    [
        ([1, 2, 500], {}, None, "outside the vocabulary"),
        ([], {}, None, "empty"),
        ([1, 2], {"temperature": -1.0}, None, "temperature"),
        ([1, 2], {"max_tokenz": 3}, None, "unknown sampling field"),
        ([1, 2], {"max_tokens": 2}, [4, 5], "already reached"),
        (list(range(1, 97)) * 6, {}, None, "no room in the context"),
    ],
)
def test_bad_requests_are_request_scoped(
    engine: RolloutEngine, reference: Checkpoint, prompt: list[int], sampling: dict[str, Any],
    prior: list[int] | None, match: str,
) -> None:  # fmt: skip
    engine.add_request("good", PROMPTS[0], greedy(max_tokens=5))
    with pytest.raises(RequestError, match=match):
        engine.add_request("bad", prompt, sampling, prior_output_ids=prior)
    with pytest.raises(RequestError, match="already in the engine"):
        engine.add_request("good", PROMPTS[0], greedy(max_tokens=5))
    assert engine.abort("bad") is None
    assert run_to_completion(engine)[0]["good"].output_ids == reference.reference_greedy(PROMPTS[0], 5)


def test_status_reports_queues_kv_and_throughput(engine: RolloutEngine) -> None:
    before = engine.status().num_generated_tokens_total
    for index in range(10):  # more than max_num_seqs=8
        engine.add_request(str(index), [1 + index] * 40, greedy(max_tokens=30))
    waiting = engine.status()
    assert waiting.num_waiting == 10 and waiting.request_tokens["3"] == (40, 0)
    step_until_tokens(engine, "0", 2)
    busy = engine.status()
    assert busy.num_running == 8 and busy.num_waiting == 2 and busy.num_kv_blocks_used >= 8 * 2
    assert busy.num_kv_blocks_total == 64 and busy.kv_capacity_tokens == 64 * BLOCK
    assert 8 * 40 <= busy.num_kv_tokens <= 8 * 42
    assert engine.waiting_queue().num_waiting == 2
    run_to_completion(engine)
    done = engine.status()
    assert (done.num_running, done.num_waiting, done.num_kv_blocks_used) == (0, 0, 0)
    assert done.num_generated_tokens_total - before == 300 and done.tokens_per_s > 0


@pytest.fixture(scope="module", params=BACKENDS)
def small_kv(request: pytest.FixtureRequest, reference: Checkpoint) -> Iterator[RolloutEngine]:
    engine = build(request.param, reference.path, num_kv_blocks=8, max_num_seqs=4)
    yield engine
    close(engine)


def run_until_preempted(engine: RolloutEngine, prompts: dict[str, list[int]]) -> list[str]:
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, greedy(max_tokens=120))
    for _ in range(2000):
        engine.step()
        preempted = engine.waiting_queue().preempted_request_ids
        if preempted:
            return preempted
    raise AssertionError("no request was preempted")


def test_kv_pressure_preempts_and_preempted_requests_show_in_the_waiting_queue(
    small_kv: RolloutEngine, reference: Checkpoint
) -> None:
    prompts = {str(i): [1 + i] * 40 for i in range(4)}  # each grows to 160 tokens (5 blocks); 8 blocks in all
    preempted = run_until_preempted(small_kv, prompts)
    status = small_kv.status()
    assert status.num_preempted_waiting == len(preempted) and status.num_waiting >= len(preempted)
    results = run_to_completion(small_kv)[0]
    for request_id, result in results.items():  # recomputed after preemption, still exact
        assert result.output_ids == reference.reference_greedy(prompts[request_id], 120)
    assert small_kv.status().num_preemptions_total >= 1
    # what the rollout actor does past max_num_waiting_reqs_after_preemption: abort and hand back
    preempted = run_until_preempted(small_kv, prompts)
    looped_back = small_kv.abort(preempted[0])
    assert looped_back is not None and looped_back.output_ids
    expected = reference.reference_greedy(prompts[preempted[0]], len(looped_back.output_ids))
    assert looped_back.output_ids == expected and preempted[0] not in small_kv.waiting_queue().preempted_request_ids
    for request_id in prompts:
        small_kv.abort(request_id)


def test_a_stop_token_ends_the_request_with_stop(engine: RolloutEngine, reference: Checkpoint) -> None:
    prompt = PROMPTS[0]
    expected = reference.reference_greedy(prompt, 12)
    stop = expected[3]
    engine.add_request("s", prompt, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop,)))
    result = run_to_completion(engine)[0]["s"]
    assert result.output_ids == expected[: expected.index(stop) + 1] and result.finish_reason == FinishReason.STOP


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_smollm2_greedy_and_logprobs_match_transformers(backend: str) -> None:
    """The real 30-layer SmolLM2-135M-Instruct, under the same log-prob tolerance."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tools.convert_smollm2 import default_output_dir

    model_dir = default_output_dir()
    if not (model_dir / "model.safetensors").is_file():
        pytest.skip(f"no converted SmolLM2 at {model_dir}; run tools/convert_smollm2.py (see its docstring)")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reference = Checkpoint("smollm2", model_dir, AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    questions = ["What is the capital of France?", "Name three primary colours.", "What is 12 times 12?"]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in questions]  # fmt: skip
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    engine = build(backend, model_dir, num_kv_blocks=32)
    try:
        for index, prompt in enumerate(prompts):
            engine.add_request(str(index), prompt, SamplingParams(max_tokens=24, temperature=0.0))
        results = run_to_completion(engine)[0]
    finally:
        close(engine)
    for index, prompt in enumerate(prompts):
        got = results[str(index)]
        assert got.output_ids == reference.reference_greedy(prompt, 24)[: len(got.output_ids)]
        expected = scored_logprobs(reference, prompt, got.output_ids)
        assert got.logprobs == pytest.approx(expected, abs=LOGPROB_TOLERANCE), questions[index]
    assert "Paris" in tokenizer.decode(results["0"].output_ids)
