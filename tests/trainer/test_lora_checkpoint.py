"""LoRA checkpoints: the adapters saved (peft layout) beside a merged Hugging Face export, and a resumed
trainer that continues exactly; checkpoints and trainers that disagree on LoRA are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from psrl.trainer import CheckpointError, TrainerCore
from psrl.trainer.lora import LoraSettings
from psrl.trainer.models import load_policy

from .trainer_helpers import make_buffer, trainer_config

LORA = ["actor.lora.rank=4", "actor.lora.alpha=8", "actor.lora.target_modules=[q_proj,v_proj,down_proj]"]


def _core(model_dir: Path, overrides: list[str]) -> TrainerCore:
    return TrainerCore(trainer_config([f"model.path={model_dir}", *overrides]), model_dir=model_dir)


def test_checkpoint_holds_the_adapters_and_a_merged_export(tiny_model_dir: Path, tmp_path: Path) -> None:
    core = _core(tiny_model_dir, LORA)
    core.train_buffer(0, make_buffer(0))
    path = core.save_checkpoint(tmp_path)
    adapters = load_file(str(path / "policy_adapter" / "adapter_model.safetensors"))
    assert set(adapters) == {f"base_model.model.{n}.weight" for n, _ in core.named_weights()}
    config = json.loads((path / "policy_adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["down_proj", "q_proj", "v_proj"])
    optimizer_state = load_file(str(path / "policy_optimizer.safetensors"))
    assert optimizer_state and all(".lora_" in key for key in optimizer_state), "optimizer state: adapters only"
    exported = AutoModelForCausalLM.from_pretrained(str(path / "policy"), dtype=torch.float32).eval()
    assert not any("lora" in name for name in exported.state_dict())
    # the adapted (unmerged) policy, built apart from the trainer's own forward path
    adapted = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"),
                          LoraSettings(4, 8.0, 0.0, ("q_proj", "v_proj", "down_proj")))  # fmt: skip
    adapted.load_state_dict(dict(core.named_weights()), strict=False)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5]])
    with torch.no_grad():
        difference = exported(input_ids=ids).logits - adapted(input_ids=ids).logits
    assert difference.abs().max() < 1e-5


def test_resuming_continues_the_same_adapters(tiny_model_dir: Path, tmp_path: Path) -> None:
    core = _core(tiny_model_dir, LORA)
    core.train_buffer(0, make_buffer(0))
    path = core.save_checkpoint(tmp_path)
    resumed = _core(tiny_model_dir, LORA)
    assert resumed.load_checkpoint(path) == 1
    saved = dict(core.named_weights())
    assert all(torch.equal(t, saved[n]) for n, t in resumed.named_weights())
    core.train_buffer(1, make_buffer(1))
    resumed.train_buffer(1, make_buffer(1))
    continued = dict(core.named_weights())
    assert all(torch.equal(t, continued[n]) for n, t in resumed.named_weights()), "optimizer state and RNG resumed"


def test_checkpoints_and_trainers_that_disagree_on_lora_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    lora_path = _core(tiny_model_dir, LORA).save_checkpoint(tmp_path / "lora")
    full_path = _core(tiny_model_dir, []).save_checkpoint(tmp_path / "full")
    with pytest.raises(CheckpointError, match="with LoRA adapters cannot resume a trainer without"):
        _core(tiny_model_dir, []).load_checkpoint(lora_path)
    with pytest.raises(CheckpointError, match="without LoRA adapters cannot resume a trainer with"):
        _core(tiny_model_dir, LORA).load_checkpoint(full_path)
    with pytest.raises(CheckpointError, match=r"actor\.lora\.alpha"):
        _core(tiny_model_dir, [*LORA, "actor.lora.alpha=16"]).load_checkpoint(lora_path)
