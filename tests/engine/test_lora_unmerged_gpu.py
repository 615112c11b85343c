"""Unmerged LoRA on CUDA: the projections' adapter matmuls inside the captured CUDA graphs and the Triton step
kernels' decode rounds give merge mode's greedy tokens and log-probs (fp32: rounding; bf16: the merged weight's
bf16 rounding against the unmerged sum's, up to 0.13 in log-prob on this wide-init model when run on a CPU;
wrong adapters change the first tokens). Skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from psrl.engine import Engine, EngineArgs
from psrl.engine.lora_merge import LoraServing
from tests.engine.conftest import greedy, make_checkpoint, run_to_completion
from tests.engine.test_lora_unmerged import ALPHA, PROMPTS, RANK, TARGETS, _version

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize(("dtype", "gpu_kernels", "tolerance"), [("float32", "off", 1e-3), ("bfloat16", "auto", 0.3)])
def test_cuda_unmerged_serves_what_merge_serves(tmp_path: Path, dtype: str, gpu_kernels: str, tolerance: float) -> None:
    checkpoint = make_checkpoint("qwen2_tied", tmp_path / "qwen2")
    version = list(_version(checkpoint, 1).items())
    results = {}
    for mode in ("merge", "unmerged"):
        engine = Engine(EngineArgs(model_path=checkpoint.path, dtype=dtype, device="cuda", num_kv_blocks=48,  # type: ignore[arg-type]
                                   gpu_kernels=gpu_kernels, lora=LoraServing(ALPHA, TARGETS, RANK, mode)))  # type: ignore[arg-type]  # fmt: skip
        engine.load_weights(version, version=1)
        for request_id, prompt in PROMPTS.items():
            engine.add_request(request_id, prompt, greedy(max_tokens=24))
        results[mode] = run_to_completion(engine)[0]
    for request_id in PROMPTS:
        merged, unmerged = results["merge"][request_id], results["unmerged"][request_id]
        pairs = list(zip(merged.output_ids, unmerged.output_ids, strict=True))
        agree = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
        # fp32: every token; bf16: greedy near-ties may flip late in a sequence, the first tokens agree
        assert agree == len(pairs) if dtype == "float32" else agree >= 8
        assert max(abs(merged.logprobs[i] - unmerged.logprobs[i]) for i in range(agree)) < tolerance
