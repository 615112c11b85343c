"""A trainer checkpoint's policy directory serves in vLLM as it is (marker `vllm`, `make test-vllm`).

The model has the shapes vLLM's CPU attention supports (head size 64, KV blocks of 32 tokens).
After one trained buffer the weights differ from the initial ones, and agreeing greedy tokens
between vLLM, the embedded engine and transformers on the saved directory show that every
tensor was written under the name and layout a Hugging Face loader expects.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from psrl.engine import Engine, EngineArgs
from psrl.trainer import TrainerCore
from tests.engine.conftest import greedy, run_to_completion

from .trainer_helpers import VOCAB, make_buffer, trainer_config

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 9, 3, 17], [22, 4], [7, 7, 30, 2, 11, 40]]
NEW_TOKENS = 12


def write_head64_model(directory: Path) -> Path:
    torch.manual_seed(7)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, initializer_range=0.2)  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(str(directory))
    return directory


def engine_args(model_dir: Path) -> dict[str, object]:
    return dict(model_path=model_dir, dtype="float32", device="cpu", block_size=32, num_kv_blocks=16, max_num_seqs=4)


def greedy_tokens(engine: object) -> list[list[int]]:
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(str(index), prompt, greedy(NEW_TOKENS))  # type: ignore[attr-defined]
    results, _ = run_to_completion(engine)  # type: ignore[arg-type]
    return [results[str(index)].output_ids for index in range(len(PROMPTS))]


def transformers_greedy(model_dir: Path) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    for prompt in PROMPTS:
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=0)  # fmt: skip
        out.append(ids[0, len(prompt) :].tolist())
    return out


def test_trained_policy_directory_serves_in_vllm(tmp_path: Path) -> None:
    from psrl.engine.vllm_backend import VllmEngine, VllmEngineArgs, vllm_unavailable

    missing = vllm_unavailable()
    if missing is not None:
        pytest.skip("{}: {}".format(*missing))
    initial = write_head64_model(tmp_path / "initial")
    core = TrainerCore(trainer_config([f"model.path={initial}"]))
    core.train_buffer(0, make_buffer(0))
    policy = core.save_checkpoint(tmp_path / "ckpt") / "policy"

    trained, before = load_file(policy / "model.safetensors"), load_file(initial / "model.safetensors")
    assert any(not torch.equal(trained[name], before[name]) for name in before), "training changed no weight"
    expected = transformers_greedy(policy)
    assert greedy_tokens(Engine(EngineArgs(**engine_args(policy)))) == expected  # type: ignore[arg-type]
    vllm = VllmEngine(VllmEngineArgs(**engine_args(policy)))  # type: ignore[arg-type]
    try:
        assert greedy_tokens(vllm) == expected
    finally:
        vllm.shutdown()
