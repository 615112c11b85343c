"""Randomly initialised Hugging Face checkpoints (the reference) and helpers to drive the engine.

The reference implementation is transformers itself, run on the same weights; nothing is faked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels (where Triton is installed) run in its interpreter; triton reads the flag when first
    # imported, which importing transformers' models does
    os.environ.setdefault("TRITON_INTERPRET", "1")

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from psrl.engine import Engine, EngineArgs, RequestResult, SamplingParams, StepOutput

VOCAB_SIZE = 97
COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    # a wide init gives well-separated logits, so greedy decoding is not decided by float noise
    initializer_range=0.2,
    eos_token_id=None,
)
MODEL_CONFIGS: dict[str, Callable[[], Qwen2Config | Qwen3Config | LlamaConfig]] = {
    "qwen2_tied": lambda: Qwen2Config(**COMMON, tie_word_embeddings=True),
    "llama_llama3_rope": lambda: LlamaConfig(
        **COMMON,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "qwen2_yarn_rope": lambda: Qwen2Config(
        **COMMON,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    # Qwen3 dense: per-head q/k RMSNorm, and a head_dim that is not hidden_size / num_heads
    "qwen3_qk_norm": lambda: Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=True),
    "llama_linear_rope_bias": lambda: LlamaConfig(
        **COMMON, attention_bias=True, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    ),
}


@dataclass
class Checkpoint:
    name: str
    path: Path
    model: PreTrainedModel

    def reference_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [len, vocab] of a plain full-sequence forward, no cache."""
        with torch.no_grad():
            return self.model(torch.tensor([token_ids])).logits[0].float()

    def reference_greedy(self, prompt: list[int], num_tokens: int) -> list[int]:
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt]), max_new_tokens=num_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        return out[0, len(prompt) :].tolist()


def make_checkpoint(name: str, directory: Path, seed: int = 0) -> Checkpoint:
    torch.manual_seed(seed)
    config = MODEL_CONFIGS[name]()
    classes = {Qwen2Config: Qwen2ForCausalLM, Qwen3Config: Qwen3ForCausalLM, LlamaConfig: LlamaForCausalLM}
    model_class = classes[type(config)]
    model = model_class(config).eval()
    model.save_pretrained(directory)
    return Checkpoint(name, directory, model)


@pytest.fixture(scope="session", params=sorted(MODEL_CONFIGS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return make_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="session")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return make_checkpoint("qwen2_tied", tmp_path_factory.mktemp("qwen2"))


def make_engine(checkpoint: Checkpoint, **overrides: object) -> Engine:
    values: dict[str, object] = dict(model_path=checkpoint.path, dtype="float32", device="cpu", block_size=4)
    values.update(overrides)
    return Engine(EngineArgs(**values))  # type: ignore[arg-type]


def greedy(max_tokens: int, **extra: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **extra)  # type: ignore[arg-type]


@dataclass
class LogitRecorder:
    """Spy on the model runner: keeps every logits row with the sequence length it was computed at."""

    rows: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)

    def attach(self, engine: Engine) -> None:
        execute = engine.runner.execute

        def recording_execute(batch):  # type: ignore[no-untyped-def]
            logits, seqs = execute(batch)
            for row, seq in enumerate(seqs):
                self.rows.setdefault(seq.request_id, []).append((seq.num_tokens, logits[row].clone()))
            return logits, seqs

        engine.runner.execute = recording_execute  # type: ignore[method-assign]

    def max_error(self, checkpoint: Checkpoint, request_id: str, token_ids: list[int]) -> float:
        """Largest |engine - reference| over every recorded step of the request."""
        reference = checkpoint.reference_logits(token_ids)
        rows = self.rows[request_id]
        errors = [(logits.to(reference) - reference[length - 1]).abs().max().item() for length, logits in rows]
        return max(errors)


def run_to_completion(engine: Engine, max_steps: int = 10_000) -> tuple[dict[str, RequestResult], list[StepOutput]]:
    results: dict[str, RequestResult] = {}
    steps: list[StepOutput] = []
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return results, steps
        out = engine.step()
        steps.append(out)
        results.update((result.request_id, result) for result in out.finished)
    raise AssertionError(f"engine did not finish within {max_steps} steps")
