"""LoRA's names and arithmetic, shared by the trainer (which trains adapters) and the engines (which merge them).

An adapter of the linear layer ``<module>`` (a Hugging Face module name such as
``model.layers.3.self_attn.q_proj``) is two plain tensors with stable names:

    <module>.lora_A   [rank, in_features]
    <module>.lora_B   [out_features, rank]

and the layer computes ``x @ (W + scaling * B @ A).T`` with ``scaling = alpha / rank``. Those two
names are what the parameter server versions and syncs; the merged weight goes under the base
weight's own name, ``<module>.weight``, so any loader of Hugging Face weights takes it as it is.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

LORA_A = "lora_A"
LORA_B = "lora_B"


class AdapterError(ValueError):
    """Adapter tensors that do not fit the base weights (names, shapes, a missing half)."""


def adapter_names(module: str) -> tuple[str, str]:
    return f"{module}.{LORA_A}", f"{module}.{LORA_B}"


def split_adapter_name(name: str) -> tuple[str, str] | None:
    """``(module, "lora_A" | "lora_B")`` for an adapter tensor's name, else None."""
    module, _, kind = name.rpartition(".")
    return (module, kind) if module and kind in (LORA_A, LORA_B) else None


def is_adapter_name(name: str) -> bool:
    return split_adapter_name(name) is not None


def base_weight_name(module: str) -> str:
    return f"{module}.weight"


def targeted_module(weight_name: str, targets: Iterable[str]) -> str | None:
    """The module of a Hugging Face weight name when its last part is one of ``targets`` (e.g. q_proj)."""
    if not weight_name.endswith(".weight"):
        return None
    module = weight_name.removesuffix(".weight")
    return module if module.rpartition(".")[2] in set(targets) else None


def merge_weight(base: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float) -> Tensor:
    """``base + scaling * B @ A``, summed in fp32 and returned in the base's dtype (a new tensor)."""
    check_adapter_shapes("", base.shape, lora_a.shape, lora_b.shape)
    # one fused pass (base + scaling * B @ A), no separate delta tensor: the merge is memory-bound
    merged = torch.addmm(base.float(), lora_b.to(base.device).float(), lora_a.to(base.device).float(), alpha=scaling)
    return merged.to(base.dtype)


def check_adapter_shapes(module: str, base: torch.Size, lora_a: torch.Size, lora_b: torch.Size) -> None:
    out_features, in_features = base
    rank = lora_a[0] if len(lora_a) == 2 else -1
    if len(lora_a) != 2 or len(lora_b) != 2 or lora_a[1] != in_features or lora_b != (out_features, rank):
        raise AdapterError(
            f"{module or 'adapter'}: lora_A {tuple(lora_a)} and lora_B {tuple(lora_b)} do not fit a weight of "
            f"{tuple(base)} (expected [rank, {in_features}] and [{out_features}, rank])"
        )
