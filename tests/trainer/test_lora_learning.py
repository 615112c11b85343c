"""Learning check with LoRA: GRPO on the demo task, adapters only, raises the demo model's held-out reward.

The same in-process loop as test_learning.py (embedded engine, demo task, synchronous steps), with
``actor.lora.rank=8`` on every projection: each step the engine loads the adapters only and merges
them onto its base. The adapters' rate is left at its default, 10 x actor.lr (2e-3 here, against the
full fine-tuning test's 2e-4). Measured on two loaded cores: held-out reward 0.134 -> 0.195 after 40
steps (the full fine-tuning run's bar, +0.04 and x1.25, holds); minutes, so `slow`.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer

from psrl.engine import Engine, EngineArgs
from psrl.tasks import get_task
from psrl.trainer import TrainerCore

from .test_learning import DEMO_MODEL, generate, held_out_reward, learning_config, prompt_indices

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

LORA = ["actor.lora.rank=8", "actor.lora.alpha=16"]
NUM_STEPS = 40


@pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason=f"no demo model at {DEMO_MODEL}")
def test_grpo_with_lora_raises_demo_reward() -> None:
    torch.manual_seed(0)
    config = learning_config(LORA)
    assert config.actor.lora.policy_lr(config.actor.lr) == pytest.approx(10 * config.actor.lr)
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL))
    args = EngineArgs.from_config(config)
    engine = Engine(EngineArgs(model_path=str(DEMO_MODEL), device="cpu", dtype="float32", lora=args.lora))
    core = TrainerCore(config, model_dir=DEMO_MODEL)
    task = get_task("demo", seed=config.task.seed)
    before = held_out_reward(engine, tokenizer, config)
    rng, rewards = random.Random(0), []
    for step in range(NUM_STEPS):
        indices = prompt_indices(task, rng, config.psrl.staleness_buffer_entries)
        buffer = generate(engine, tokenizer, task, indices, config.psrl.rollout_n, seed=step + 2, config=config)
        rewards.append(sum(t.reward for t in buffer) / len(buffer))
        result = core.train_buffer(step, buffer)
        adapters = [(name, t.detach().clone()) for name, t in core.named_weights()]
        assert all(".lora_" in name for name, _ in adapters)
        engine.load_weights(adapters, version=result.version)
    after = held_out_reward(engine, tokenizer, config)
    third = NUM_STEPS // 3
    first, last = sum(rewards[:third]) / third, sum(rewards[-third:]) / third
    assert after >= max(before + 0.04, 1.25 * before), f"held-out reward {before:.3f} -> {after:.3f}"
    assert last > first, f"training reward {first:.3f} -> {last:.3f}"
