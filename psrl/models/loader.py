"""Build a `DecoderModel` from a Hugging Face checkpoint directory (config.json + safetensors)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from psrl.errors import FatalError
from psrl.models.llama import DecoderModel, rotation_table
from psrl.models.spec import ModelSpec
from psrl.models.weights import WeightLoadError


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every *.safetensors file in the directory."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FatalError(f"no *.safetensors file in {path}")
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                yield name, handle.get_tensor(name)


def build_model(
    spec: ModelSpec,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    weights: Iterable[tuple[str, torch.Tensor]],
) -> DecoderModel:
    """Allocate the model without initialising it, then fill every parameter from `weights`."""
    with torch.device("meta"):
        model = DecoderModel(spec, max_positions)
    model = model.to_empty(device=device)
    model = model.to(dtype)
    # the rotary table is computed, not loaded (to_empty left it uninitialised); it stays complex64
    model.rope_rotation = rotation_table(spec, max_positions).to(device)
    missing = set(expected_weight_names(spec)) - model.load_weights(weights)
    if missing:
        raise WeightLoadError(f"checkpoint lacks {len(missing)} tensors this model needs, e.g. {sorted(missing)[:3]}")
    return model.eval()


def expected_weight_names(spec: ModelSpec) -> list[str]:
    """The Hugging Face tensor names a complete checkpoint of this spec holds."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not spec.tie_word_embeddings:
        names.append("lm_head.weight")
    for index in range(spec.num_layers):
        prefix = f"model.layers.{index}."
        names += [prefix + "input_layernorm.weight", prefix + "post_attention_layernorm.weight"]
        for proj in ("q_proj", "k_proj", "v_proj"):
            names.append(f"{prefix}self_attn.{proj}.weight")
            if spec.has_qkv_bias:
                names.append(f"{prefix}self_attn.{proj}.bias")
        if spec.has_qk_norm:
            names += [prefix + "self_attn.q_norm.weight", prefix + "self_attn.k_norm.weight"]
        names.append(prefix + "self_attn.o_proj.weight")
        if spec.has_o_bias:
            names.append(prefix + "self_attn.o_proj.bias")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names.append(f"{prefix}mlp.{proj}.weight")
            if spec.has_mlp_bias:
                names.append(f"{prefix}mlp.{proj}.bias")
    return names
