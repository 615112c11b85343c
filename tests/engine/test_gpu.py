"""The engine on CUDA (eager and CUDA graphs) against transformers; skipped without a GPU."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.engine.conftest import Checkpoint, LogitRecorder, greedy, make_engine, run_to_completion

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _prompts(num: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(1, 97) for _ in range(rng.randint(3, 40))] for _ in range(num)]


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_cuda_fp32_matches_transformers(qwen2: Checkpoint, cuda_graphs: bool) -> None:
    engine = make_engine(qwen2, device="cuda", num_kv_blocks=48, max_num_seqs=16, cuda_graphs=cuda_graphs)
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


def test_cuda_bf16_prefill_agrees_with_transformers_bf16(qwen2: Checkpoint) -> None:
    reference = copy.deepcopy(qwen2.model).to(device="cuda", dtype=torch.bfloat16)
    engine = make_engine(qwen2, device="cuda", dtype="bfloat16", num_kv_blocks=64)
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
