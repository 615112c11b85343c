"""LoRA on the trainer's Hugging Face policy: adapters on the target projections, the base frozen.

`apply_lora` replaces each targeted ``nn.Linear`` by a `LoraLinear` that keeps the base's own
``weight`` and ``bias`` (same parameters, same names, frozen) and adds two plain parameters,
``lora_A`` [rank, in] (Kaiming-uniform, as peft) and ``lora_B`` [out, rank] (zeros), so the model
starts exactly at the base. Every other parameter is frozen too, so the optimizer (built from the
parameters that require grad) holds state for the adapters only.

Names are stable and plain (``model.layers.3.self_attn.q_proj.lora_A``, see `psrl.models.lora`):
they are what the parameter server versions and what the engines merge.

Dropout (``actor.lora.dropout``) applies to the adapters' input in forwards that build a graph
(the update's forward and backward) and never in no-grad forwards: the trainer keeps its models in
eval mode so that the old / reference log-probs are those of the deterministic policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional

from psrl.config.training import Lora
from psrl.errors import ConfigError, ConfigProblem
from psrl.models.lora import LORA_A, LORA_B, base_weight_name, is_adapter_name, merge_weight


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_config(cls, lora: Lora) -> LoraSettings | None:
        """The settings of ``actor.lora``; None when LoRA is off (rank 0)."""
        if not lora.enabled:
            return None
        return cls(lora.rank, lora.alpha, lora.dropout, tuple(lora.target_modules))


class LoraLinear(nn.Linear):
    """A linear layer plus ``scaling * B @ A``; ``weight`` and ``bias`` are the base layer's own parameters."""

    def __init__(self, base: nn.Linear, settings: LoraSettings) -> None:
        nn.Module.__init__(self)  # nn.Linear.__init__ would allocate a second weight
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        dtype, device = base.weight.dtype, base.weight.device
        self.lora_A = nn.Parameter(torch.empty(settings.rank, self.in_features, dtype=dtype, device=device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, settings.rank, dtype=dtype, device=device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.alpha, self.scaling = settings.alpha, settings.scaling
        self.dropout = settings.dropout

    def forward(self, x: Tensor) -> Tensor:
        out = functional.linear(x, self.weight, self.bias)
        if self.dropout > 0 and torch.is_grad_enabled():
            x = functional.dropout(x, p=self.dropout, training=True)
        return out + functional.linear(functional.linear(x, self.lora_A), self.lora_B) * self.scaling

    def merged_weight(self) -> Tensor:
        return merge_weight(self.weight.detach(), self.lora_A.detach(), self.lora_B.detach(), self.scaling)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.lora_A.shape[0]}, scaling={self.scaling:g}"


def apply_lora(model: nn.Module, settings: LoraSettings) -> list[str]:
    """Put adapters on every targeted projection and freeze everything else; returns the wrapped modules' names.

    Raises ConfigError naming actor.lora.target_modules when a target matches no linear layer."""
    matched: dict[str, list[str]] = {target: [] for target in settings.target_modules}
    for name, module in list(model.named_modules()):
        target = name.rpartition(".")[2]
        if target in matched and type(module) is nn.Linear:
            matched[target].append(name)
    missing = [target for target, names in matched.items() if not names]
    if missing:
        raise ConfigError([ConfigProblem(
            ("actor.lora.target_modules",), repr(list(settings.target_modules)),
            f"{missing} match no linear layer of this {type(model).__name__}",
            "name projections the model has (Llama / Qwen: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
            "down_proj)",
        )])  # fmt: skip
    model.requires_grad_(False)
    wrapped = sorted(name for names in matched.values() for name in names)
    for name in wrapped:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoraLinear(getattr(parent, child), settings))
    return wrapped


def lora_modules(model: nn.Module) -> Iterator[tuple[str, LoraLinear]]:
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            yield name, module


def has_lora(model: nn.Module) -> bool:
    return next(lora_modules(model), None) is not None


def adapter_names(model: nn.Module) -> list[str]:
    """The names of every adapter tensor, in the model's order (what the parameter server holds)."""
    return [f"{name}.{part}" for name, _ in lora_modules(model) for part in (LORA_A, LORA_B)]


def merged_state_dict(model: nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` (the model's full state dict) with each adapter merged into its base weight and dropped:
    a plain Hugging Face state dict any loader reads."""
    merged = {name: tensor for name, tensor in state.items() if not is_adapter_name(name)}
    for name, module in lora_modules(model):
        weight = base_weight_name(name)
        a, b = state[f"{name}.{LORA_A}"], state[f"{name}.{LORA_B}"]
        merged[weight] = merge_weight(state[weight], a, b, module.scaling)
    return merged


def adapter_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: tensor for name, tensor in state.items() if is_adapter_name(name)}
