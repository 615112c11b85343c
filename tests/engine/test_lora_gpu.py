"""LoRA on CUDA: a trainer's adapters merged on load by a CUDA engine (fp32: the trainer's logits; bf16:
the fp32 merge within bf16 rounding), and the merge of a 1.5B-shaped version timed. Skipped without a GPU."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from psrl.engine import Engine, EngineArgs
from psrl.engine.lora_merge import AdapterMerger, LoraServing
from psrl.models.lora import merge_weight
from psrl.trainer import TrainerCore
from tests.engine.conftest import Checkpoint, LogitRecorder, greedy, make_checkpoint, run_to_completion
from tests.trainer.trainer_helpers import make_buffer, trainer_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ALPHA = 8.0
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_cuda_engine_serves_the_lora_trainers_logits(tmp_path: Path) -> None:
    checkpoint = make_checkpoint("qwen2_tied", tmp_path / "qwen2")
    lora = ["actor.lora.rank=4", f"actor.lora.alpha={ALPHA}", "topology.device=cpu"]
    core = TrainerCore(trainer_config([f"model.path={checkpoint.path}", *lora]))
    core.train_buffer(0, make_buffer(0))
    engine = Engine(EngineArgs(model_path=checkpoint.path, dtype="float32", device="cuda", num_kv_blocks=48,
                               gpu_kernels="off", lora=LoraServing(ALPHA, TARGETS)))  # fmt: skip
    engine.load_weights(list(core.named_weights()), version=1)
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompt = [3, 14, 15, 9, 26]
    engine.add_request("0", prompt, greedy(max_tokens=6))
    output = run_to_completion(engine)[0]["0"].output_ids
    adapted = Checkpoint(checkpoint.name, checkpoint.path, core.policy.raw.eval())
    assert recorder.max_error(adapted, "0", prompt + output) < 1e-3


def test_bf16_merge_rounds_the_fp32_merge() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(1536, 1536, generator=gen, device="cuda")
    lora_a = torch.randn(16, 1536, generator=gen, device="cuda") * 0.05
    lora_b = torch.randn(1536, 16, generator=gen, device="cuda") * 0.01
    exact = merge_weight(base, lora_a, lora_b, 2.0)
    merged = merge_weight(base.bfloat16(), lora_a, lora_b, 2.0)
    assert merged.dtype == torch.bfloat16
    # two bf16 roundings (the base weight's, then the sum's): each within 2^-9 of what it rounds
    tolerance = (base.abs() + exact.abs()) * 2**-8 + 1e-6
    assert ((merged.float() - exact).abs() <= tolerance).all()


def test_merge_of_a_1_5b_shaped_version_is_timed() -> None:
    """Reports the merge time of every projection of 28 layers at rank 16 (the goal: sync+load <= 50 ms)."""
    hidden, inter, kv, rank = 1536, 8960, 256, 16
    shapes = {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, hidden),
              "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}  # fmt: skip
    merger = AdapterMerger(LoraServing(32.0, TARGETS), torch.device("cuda"), torch.bfloat16)
    version = []
    for layer in range(28):
        for target, (out_features, in_features) in shapes.items():
            module = f"model.layers.{layer}.{'self_attn' if target[0] in 'qkvo' else 'mlp'}.{target}"
            merger.base[module] = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16)
            version.append((f"{module}.lora_A", torch.randn(rank, in_features, device="cuda", dtype=torch.bfloat16)))
            version.append((f"{module}.lora_B", torch.randn(out_features, rank, device="cuda", dtype=torch.bfloat16)))
    merger.prepare(version)
    merger.commit()
    torch.cuda.synchronize()
    started = time.perf_counter()
    merged = merger.prepare(version)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    print(f"RESULT lora_merge_1_5b_ms={seconds * 1000:.1f}")
    assert len(merged) == 28 * 7
