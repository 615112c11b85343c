"""LoRA on the trainer: the merged model computes the adapted model's outputs, only adapters train,
a version is the adapters, and a target the model lacks is refused naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from psrl.errors import ConfigError
from psrl.trainer import TrainerCore
from psrl.trainer.lora import LoraLinear, LoraSettings, apply_lora, merged_state_dict
from psrl.trainer.models import load_policy

from .trainer_helpers import make_buffer, trainer_config

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA = ["actor.lora.rank=4", "actor.lora.alpha=8"]


def _randomise_adapters(model: nn.Module, seed: int = 0) -> None:
    """lora_B starts at zero (the model equals the base); give it values so the merge has work to do."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=generator) * 0.05)


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits  # type: ignore[no-any-return]


def test_merged_model_computes_the_adapted_models_logits(tiny_model_dir: Path) -> None:
    policy = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"), LoraSettings(4, 8.0, 0.0, ALL))
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8]])
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    assert torch.equal(_logits(policy, ids), _logits(base, ids)), "zero lora_B: the adapted model is the base"
    _randomise_adapters(policy)
    adapted = _logits(policy, ids)
    merged = merged_state_dict(policy, policy.state_dict())
    assert not any("lora" in name for name in merged) and set(merged) == set(base.state_dict())
    base.load_state_dict(merged)
    assert (adapted - _logits(base, ids)).abs().max() < 1e-5  # fp32: merged == unmerged
    assert (adapted - _logits(load_policy(tiny_model_dir, torch.float32, torch.device("cpu")), ids)).abs().max() > 1e-3


def test_only_adapters_train_and_a_version_is_the_adapters(tiny_model_dir: Path) -> None:
    core = TrainerCore(trainer_config([f"model.path={tiny_model_dir}", *LORA]), model_dir=tiny_model_dir)
    raw = core.policy.raw
    frozen = {n: p.detach().clone() for n, p in raw.named_parameters() if "lora" not in n}
    pushed_before = {n: t.clone() for n, t in core.named_weights()}
    assert pushed_before and all(n.endswith((".lora_A", ".lora_B")) for n in pushed_before)
    assert len(pushed_before) == 2 * 2 * len(ALL)  # two layers, every projection, A and B
    core.train_buffer(0, make_buffer(0))
    trainable = {n for n, p in raw.named_parameters() if p.requires_grad}
    assert trainable == set(pushed_before)
    optimized = {id(p) for group in core.policy.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for n, p in raw.named_parameters() if n in trainable}
    assert all(torch.equal(p, frozen[n]) for n, p in raw.named_parameters() if n in frozen), "the base moved"
    after = dict(core.named_weights())
    assert any(not torch.equal(after[n], pushed_before[n]) for n in after if n.endswith("lora_B")), "B trained"


def test_only_adapters_get_gradients(tiny_model_dir: Path) -> None:
    policy = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"), LoraSettings(4, 8.0, 0.1, ALL))
    _randomise_adapters(policy)
    policy(input_ids=torch.tensor([[3, 14, 15, 9]])).logits.square().sum().backward()
    with_grads = {n for n, p in policy.named_parameters() if p.grad is not None}
    assert with_grads == {n for n, p in policy.named_parameters() if p.requires_grad}
    assert len(with_grads) == 2 * 2 * len(ALL) and all(".lora_" in n for n in with_grads)


def test_adopting_a_published_version_takes_its_adapters(tiny_model_dir: Path) -> None:
    config = trainer_config([f"model.path={tiny_model_dir}", *LORA])
    trained = TrainerCore(config, model_dir=tiny_model_dir)
    trained.train_buffer(0, make_buffer(0))
    published = {n: t.clone() for n, t in trained.named_weights()}
    fresh = TrainerCore(config, model_dir=tiny_model_dir)
    fresh.adopt_weights(1, published)
    assert fresh.version == 1
    assert all(torch.equal(t, published[n]) for n, t in fresh.named_weights())


def test_dropout_applies_only_where_gradients_flow() -> None:
    torch.manual_seed(0)
    layer = LoraLinear(nn.Linear(16, 8), LoraSettings(2, 4.0, 0.5, ("q_proj",)))
    nn.init.normal_(layer.lora_B)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(layer(x), layer(x)), "no-grad forwards are deterministic"
        expected = x @ layer.merged_weight().T + layer.bias
        assert (layer(x) - expected).abs().max() < 1e-5
    assert not torch.equal(layer(x), layer(x)), "a gradient forward drops adapter inputs"


def test_a_target_the_model_lacks_is_refused_naming_the_setting() -> None:
    model = nn.Sequential()
    model.add_module("q_proj", nn.Linear(4, 4))
    with pytest.raises(ConfigError, match=r"actor\.lora\.target_modules") as raised:
        apply_lora(model, LoraSettings(2, 4.0, 0.0, ("q_proj", "gate_proj")))
    assert "gate_proj" in str(raised.value)
