"""Where each Hugging Face tensor goes in the fused, transposed parameters of `DecoderModel`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from psrl.models.llama import DecoderLayer, DecoderModel, Projection

_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF names ignored on load: buffers some checkpoints carry
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """A weight does not belong to this model or has the wrong shape."""


@dataclass(frozen=True, slots=True)
class WeightSlot:
    """A parameter (or a slice of one) receiving an HF tensor, and how to lay the tensor out."""

    target: torch.Tensor
    is_transposed: bool = False
    # interleave the two halves of each of this many heads (q/k projections, for the complex rotary)
    num_interleaved_heads: int = 0

    @property
    def hf_shape(self) -> tuple[int, ...]:
        shape = tuple(self.target.shape)
        return shape[::-1] if self.is_transposed else shape

    def copy_from(self, tensor: torch.Tensor) -> None:
        if self.num_interleaved_heads:
            tensor = to_interleaved_halves(tensor, self.num_interleaved_heads)
        self.target.copy_(tensor.t() if self.is_transposed else tensor)


def to_interleaved_halves(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder q/k projection rows of each head from (first half, second half) to interleaved pairs."""
    rest = tensor.shape[1:]
    return tensor.reshape(num_heads, 2, -1, *rest).transpose(1, 2).reshape(tensor.shape)


def weight_slots(model: DecoderModel, name: str) -> list[WeightSlot]:
    """Slots for an HF tensor name; [] for names deliberately skipped; WeightLoadError if unknown."""
    spec = model.spec
    if name.endswith(_IGNORED_SUFFIXES):
        return []
    if name == "model.embed_tokens.weight":
        slots = [WeightSlot(model.embed_tokens.weight)]
        if spec.tie_word_embeddings:
            slots.append(WeightSlot(model.lm_head_t, is_transposed=True))
        return slots
    if name == "model.norm.weight":
        return [WeightSlot(model.norm)]
    if name == "lm_head.weight":
        # tied checkpoints may still carry the head; the embedding is what counts
        return [] if spec.tie_word_embeddings else [WeightSlot(model.lm_head_t, is_transposed=True)]
    match = _LAYER_NAME.match(name)
    if match is None or int(match.group(1)) >= len(model.layers):
        raise WeightLoadError(f"{name} is not a parameter of this {spec.model_type} model")
    layer = cast("DecoderLayer", model.layers[int(match.group(1))])
    return [_layer_slot(layer, match.group(2), name)]


def _layer_slot(layer: DecoderLayer, local: str, full_name: str) -> WeightSlot:
    spec = layer.spec
    if local == "input_layernorm.weight":
        return WeightSlot(layer.input_layernorm)
    if local == "post_attention_layernorm.weight":
        return WeightSlot(layer.post_attention_layernorm)
    norms = {"self_attn.q_norm.weight": layer.q_norm, "self_attn.k_norm.weight": layer.k_norm}
    if local in norms and (norm := norms[local]) is not None:
        return WeightSlot(norm, num_interleaved_heads=1)  # one head's dimension, interleaved like q and k
    module, _, kind = local.rpartition(".")
    parts = projection_parts(layer)
    if module in parts:
        projection, start, size, num_heads = parts[module]
        if kind == "weight":
            return WeightSlot(projection.weight_t.narrow(1, start, size), True, num_heads)
        if kind == "bias" and projection.bias is not None:
            return WeightSlot(projection.bias.narrow(0, start, size), False, num_heads)
    raise WeightLoadError(f"{full_name} is not a parameter of this {spec.model_type} model")


def projection_parts(layer: DecoderLayer) -> dict[str, tuple[Projection, int, int, int]]:
    """HF module (layer-local, e.g. ``self_attn.q_proj``) -> (fused projection, first output column, columns,
    heads whose halves are interleaved)."""
    spec = layer.spec
    return {
        "self_attn.q_proj": (layer.qkv_proj, 0, spec.q_size, spec.num_heads),
        "self_attn.k_proj": (layer.qkv_proj, spec.q_size, spec.kv_size, spec.num_kv_heads),
        "self_attn.v_proj": (layer.qkv_proj, spec.q_size + spec.kv_size, spec.kv_size, 0),
        "self_attn.o_proj": (layer.o_proj, 0, spec.hidden_size, 0),
        "mlp.gate_proj": (layer.gate_up_proj, 0, spec.intermediate_size, 0),
        "mlp.up_proj": (layer.gate_up_proj, spec.intermediate_size, spec.intermediate_size, 0),
        "mlp.down_proj": (layer.down_proj, 0, spec.hidden_size, 0),
    }
