"""Qwen3 and Llama 3.x from the trainer to the engine: the weights a trainer pushes after a step load
into the embedded engine, which then computes the trainer model's own logits (the trainer is
transformers itself, so this is the parity of the whole train -> push -> generate path)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from psrl.trainer import TrainerCore
from tests.engine.conftest import LogitRecorder, greedy, make_checkpoint, make_engine, run_to_completion
from tests.trainer.trainer_helpers import make_buffer, trainer_config

TOLERANCE = 1e-4


@pytest.mark.parametrize("name", ["qwen3_qk_norm", "llama_llama3_rope"])
def test_weights_after_a_training_step_generate_the_trainers_logits(name: str, tmp_path: Path) -> None:
    checkpoint = make_checkpoint(name, tmp_path / name)
    core = TrainerCore(trainer_config([f"model.path={checkpoint.path}"]))
    before = {n: t.clone() for n, t in core.named_weights()}
    core.train_buffer(0, make_buffer(0))
    after = dict(core.named_weights())
    if name.startswith("qwen3"):
        assert any(".q_norm." in n for n in after)
    assert not torch.equal(before["model.norm.weight"], after["model.norm.weight"]), "the step changed the weights"
    engine = make_engine(checkpoint, num_kv_blocks=64)
    engine.load_weights(list(after.items()), version=1)
    checkpoint.model = core.policy.raw.eval()  # the reference is now the trained policy
    recorder = LogitRecorder()
    recorder.attach(engine)
    prompt = [3, 14, 15, 9, 26]
    engine.add_request("0", prompt, greedy(max_tokens=6))
    results, _ = run_to_completion(engine)
    output = results["0"].output_ids
    assert output == checkpoint.reference_greedy(prompt, len(output))
    assert recorder.max_error(checkpoint, "0", prompt + output) < TOLERANCE
