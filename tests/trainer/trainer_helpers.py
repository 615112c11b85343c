"""Helpers of the trainer tests: a tiny randomly initialised Qwen2 checkpoint (a real transformers
model) and synthetic buffers. Also imported by dp_worker.py, which runs as a separate process."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from psrl.config import Config, load_config
from psrl.rl.trajectory import Trajectory

VOCAB = 48
NUM_DP_BUFFERS = 2


def write_tiny_model(directory: Path, *, tie: bool = True) -> Path:
    torch.manual_seed(1234)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        pad_token_id=0,
        eos_token_id=1,
    )
    Qwen2ForCausalLM(config).save_pretrained(str(directory))
    return directory


def trainer_config(overrides: Iterable[str] = ()) -> Config:
    base = [
        "psrl.staleness=1",
        "psrl.staleness_buffer_entries=4",
        "psrl.rollout_n=2",
        "actor.ppo_mini_batch_size=2",
        "actor.ppo_micro_batch_size_per_gpu=2",
        "actor.lr=0.001",
        "actor.strategy=ddp",
        "algorithm.adv_estimator=grpo",
        "algorithm.rollout_correction.rollout_is=token",
        "task.temperature=1.0",
    ]
    return load_config("demo", [*base, *overrides])


def make_buffer(buffer_id: int, *, num_groups: int = 4, group_size: int = 2, seed: int = 0) -> list[Trajectory]:
    """Random prompts and responses of varied lengths; rewards that differ within each group."""
    rng = random.Random(seed * 1000 + buffer_id)
    out = []
    for group in range(num_groups):
        prompt = tuple(rng.randrange(2, VOCAB) for _ in range(rng.randint(2, 6)))
        for child in range(group_size):
            length = rng.randint(1, 7)
            out.append(
                Trajectory(
                    prompt_id=buffer_id * 100 + group,
                    child=child,
                    prompt_token_ids=prompt,
                    response_token_ids=tuple(rng.randrange(2, VOCAB) for _ in range(length)),
                    rollout_log_probs=tuple(-rng.uniform(2.5, 4.5) for _ in range(length)),
                    token_versions=tuple(max(0, buffer_id - 1) for _ in range(length)),
                    version=max(0, buffer_id - 1),
                    reward=float(child == group % group_size) + rng.uniform(0, 0.1),
                    acc=float(child == group % group_size),
                )
            )
    return out
