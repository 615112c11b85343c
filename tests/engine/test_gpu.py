"""The engine on CUDA (torch path eager and with CUDA graphs, Triton step kernels) against transformers.

Skipped without a GPU. The decode rounds' fp32 parity suite (prefix hits, preemption, abort and
continuation, weight loads) is tests/engine/test_decode_rounds.py, whose `triton_cuda` cases run
here; the kernels one by one are tests/engine/test_step_kernels.py.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from psrl.engine import FinishReason
from psrl.engine.engine import Engine
from tests.engine.conftest import COMMON, Checkpoint, LogitRecorder, greedy, make_engine, run_to_completion

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _prompts(num: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(1, 97) for _ in range(rng.randint(3, 40))] for _ in range(num)]


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_cuda_fp32_matches_transformers(qwen2: Checkpoint, cuda_graphs: bool) -> None:
    # the torch path, whose every logits row the recorder sees (the rounds keep theirs on the device)
    engine = make_engine(qwen2, device="cuda", num_kv_blocks=48, max_num_seqs=16, cuda_graphs=cuda_graphs,
                         gpu_kernels="off")  # fmt: skip
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompts = _prompts(12)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, greedy(max_tokens=10 + 2 * index))
    results, _ = run_to_completion(engine)
    for index, prompt in enumerate(prompts):
        output = results[str(index)].output_ids
        assert output == qwen2.reference_greedy(prompt, len(output)), index
        rows = recorder.rows[str(index)]
        recorder.rows[str(index)] = [(length, logits.cpu()) for length, logits in rows]
        assert recorder.max_error(qwen2, str(index), prompt + output) < 1e-3, index


@pytest.mark.parametrize("gpu_kernels", ["off", "on"])
def test_cuda_bf16_prefill_agrees_with_transformers_bf16(qwen2: Checkpoint, gpu_kernels: str) -> None:
    reference = copy.deepcopy(qwen2.model).to(device="cuda", dtype=torch.bfloat16)
    engine = make_engine(qwen2, device="cuda", dtype="bfloat16", num_kv_blocks=64, gpu_kernels=gpu_kernels)
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompts = _prompts(6)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, greedy(max_tokens=1))
    run_to_completion(engine)
    for index, prompt in enumerate(prompts):
        with torch.no_grad():
            want = torch.log_softmax(reference(torch.tensor([prompt], device="cuda")).logits[0, -1].float(), -1)
        got = torch.log_softmax(recorder.rows[str(index)][0][1], -1)
        assert (got - want).abs().max().item() < 0.15, index


def test_host_weights_load_into_a_cuda_engine_exactly(qwen2: Checkpoint) -> None:
    """Host tensors are moved first and reordered on the GPU (fused, transposed, interleaved slots)."""
    on_cpu = make_engine(qwen2, num_kv_blocks=16)
    on_gpu = make_engine(qwen2, device="cuda", num_kv_blocks=16)
    weights = {name: tensor.clone() * 1.5 for name, tensor in qwen2.model.state_dict().items()}
    on_cpu.load_weights(weights, 1)
    on_gpu.load_weights(weights, 1)
    cpu_params = dict(on_cpu.runner.model.named_parameters())
    for name, param in on_gpu.runner.model.named_parameters():
        assert torch.equal(param.cpu(), cpu_params[name]), name


def test_bf16_rounds_are_as_close_to_fp32_as_transformers_bf16(qwen2: Checkpoint) -> None:
    """bf16 carries 8 significant bits, so two correct bf16 implementations differ from fp32 (and from each
    other) by rounding that grows through the layers; the bound is transformers' own bf16 error, plus 0.02."""
    bf16 = copy.deepcopy(qwen2.model).to(device="cuda", dtype=torch.bfloat16)
    fp32 = copy.deepcopy(qwen2.model).to(device="cuda")
    engine = make_engine(qwen2, device="cuda", dtype="bfloat16", num_kv_blocks=128, gpu_kernels="on")
    assert engine.runner.decode_path == "triton_graph_rounds"
    prompts = _prompts(8)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, greedy(max_tokens=20))
    results, _ = run_to_completion(engine)
    for index, prompt in enumerate(prompts):
        result = results[str(index)]
        ids = torch.tensor([prompt + result.output_ids], device="cuda")
        rows = slice(len(prompt) - 1, len(prompt) - 1 + len(result.output_ids))
        tokens = torch.tensor(result.output_ids, device="cuda").unsqueeze(1)
        with torch.no_grad():
            want = torch.log_softmax(fp32(ids).logits[0, rows].float(), -1).gather(1, tokens).squeeze(1)
            theirs = torch.log_softmax(bf16(ids).logits[0, rows].float(), -1).gather(1, tokens).squeeze(1)
        ours = torch.tensor(result.logprobs, device="cuda")
        assert (ours - want).abs().max() <= 2 * (theirs - want).abs().max() + 0.02, index


def _tokens_of(engine: Engine) -> dict[str, list[int]]:
    """The tokens eleven greedy requests of different lengths get from `engine`."""
    for index, prompt in enumerate(_prompts(11)):
        engine.add_request(str(index), prompt, greedy(max_tokens=5 + 3 * index))
    results, _ = run_to_completion(engine)
    return {key: result.output_ids for key, result in results.items()}


def test_graphs_captured_at_start_serve_the_tokens_of_graphs_captured_on_first_use(qwen2: Checkpoint) -> None:
    """Every bucket's round (and its single-step fallback) is captured before the first request, from padding
    rows alone: they must have written nothing a later sequence reads, so both engines sample alike."""
    common = dict(device="cuda", dtype="bfloat16", num_kv_blocks=128, max_num_seqs=16, gpu_kernels="on")
    eager = make_engine(qwen2, capture_graphs_at_start=True, **common)
    rounds = eager.runner.rounds
    assert rounds is not None and len(rounds._graphs) == 2 * len(rounds.buckets)
    lazy = make_engine(qwen2, **common)
    assert _tokens_of(eager) == _tokens_of(lazy)
    assert len(rounds._graphs) == 2 * len(rounds.buckets)  # nothing captured while serving


def test_rounds_captured_while_idle_one_at_a_time_serve_the_tokens_of_rounds_captured_on_first_use(
    qwen2: Checkpoint,
) -> None:
    common = dict(device="cuda", dtype="bfloat16", num_kv_blocks=128, max_num_seqs=16, gpu_kernels="on")
    idle = make_engine(qwen2, capture_graphs_when_idle=True, **common)
    rounds = idle.runner.rounds
    assert rounds is not None
    idle.add_request("busy", _prompts(1)[0], greedy(max_tokens=2))
    assert not idle.capture_when_idle() and not rounds._graphs  # never while a request is there
    run_to_completion(idle)
    missing = [bucket for bucket in rounds.buckets if (bucket, rounds.shape.max_steps) not in rounds._graphs]
    captures = 0
    while idle.capture_when_idle():
        captures += 1
    assert captures == len(missing) > 0  # one per call, and none left
    assert all((bucket, rounds.shape.max_steps) in rounds._graphs for bucket in rounds.buckets)
    lazy = make_engine(qwen2, **common)
    assert _tokens_of(idle) == _tokens_of(lazy)


def _long_context_checkpoint(directory: Path) -> Checkpoint:
    torch.manual_seed(0)
    config = Qwen2Config(**{**COMMON, "max_position_embeddings": 8448}, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    model.save_pretrained(directory)
    return Checkpoint("long", directory, model)


def _run_long_batch(checkpoint: Checkpoint, num_kv_blocks: int) -> tuple[dict, int]:
    engine = make_engine(checkpoint, device="cuda", block_size=16, num_kv_blocks=num_kv_blocks, max_num_seqs=256,
                         max_num_batched_tokens=16384, gpu_kernels="on")  # fmt: skip
    rng = random.Random(3)
    for index in range(256):
        engine.add_request(str(index), [rng.randrange(1, 97) for _ in range(8176)], greedy(max_tokens=16))
    results, _ = run_to_completion(engine, max_steps=100_000)
    assert engine.status().num_kv_blocks_used == 0
    return results, engine.status().num_preemptions_total


def test_256_sequences_of_8k_tokens_run_when_blocks_allow_and_preempt_cleanly_when_not(tmp_path: Path) -> None:
    checkpoint = _long_context_checkpoint(tmp_path)
    roomy, preemptions = _run_long_batch(checkpoint, num_kv_blocks=256 * 513)
    assert preemptions == 0 and len(roomy) == 256
    assert all(len(r.output_ids) == 16 and r.finish_reason == FinishReason.LENGTH for r in roomy.values())
    reference = copy.deepcopy(checkpoint.model).to("cuda")
    for index in ("0", "255"):
        prompt = roomy[index].prompt_ids
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=16, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)  # fmt: skip
        assert roomy[index].output_ids == out[0, len(prompt) :].tolist(), index
    # prompts take 511 blocks each: 100 sequences are admitted, and 50 free blocks cannot grow all of them
    tight, preemptions = _run_long_batch(checkpoint, num_kv_blocks=100 * 511 + 50)
    assert preemptions > 0 and len(tight) == 256
    assert all(tight[key].output_ids == roomy[key].output_ids for key in roomy)


def test_cuda_reload_from_the_pinned_host_tier_gives_the_tokens_of_a_recompute(qwen2: Checkpoint) -> None:
    from tests.engine.test_host_tier import FILLERS, PROMPT

    engine = make_engine(qwen2, device="cuda", num_kv_blocks=20, offload_bytes=4 << 20, max_num_seqs=2,
                         offload_store="host")  # fmt: skip
    assert engine.offload is not None and engine.offload.tier.store.pinned  # type: ignore[attr-defined]
    first = _greedy_one(engine, "a", PROMPT)
    for k, filler in enumerate(FILLERS):
        _greedy_one(engine, f"filler-{k}", filler)
    assert engine.block_manager.cached_blocks(PROMPT) == []
    again = _greedy_one(engine, "b", PROMPT)
    assert engine.status().num_tier_loaded_tokens == 7 * 4
    assert again.output_ids == first.output_ids == qwen2.reference_greedy(PROMPT, len(first.output_ids))


def _greedy_one(engine, request_id: str, prompt: list[int]):  # type: ignore[no-untyped-def]
    engine.add_request(request_id, prompt, greedy(max_tokens=6))
    results, _ = run_to_completion(engine)
    return results[request_id]
