"""Llama / Qwen2-family decoder for inference: fused projections, RMSNorm, RoPE, GQA, SwiGLU.

One class covers both families; the differences (qkv bias, MLP bias, tied embeddings, RoPE
scaling) come from `ModelSpec`. Projections are fused (q|k|v and gate|up) so a layer runs four
matmuls; `load_weights` maps Hugging Face parameter names onto the fused slices.

The rows of the q and k projections are stored with each head's two halves interleaved, so the
rotary embedding is one complex multiply instead of a dozen elementwise ops. Attention scores
are unchanged, since q and k get the same permutation of their head dimension.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import cast

import torch
from torch import nn
from torch.nn import functional

from psrl.models.attention import AttentionBatch, paged_attention
from psrl.models.rope import cos_sin_table
from psrl.models.spec import ModelSpec

_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF names ignored on load: buffers some checkpoints carry
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """A weight does not belong to this model or has the wrong shape."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 and cast back before the weight multiply, as the reference does."""
    if x.dtype == torch.float32:
        return functional.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = functional.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return weight * normed.to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.input_layernorm = nn.Parameter(torch.empty(spec.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.empty(spec.hidden_size))
        qkv_size = spec.q_size + 2 * spec.kv_size
        self.qkv_proj = nn.Linear(spec.hidden_size, qkv_size, bias=spec.has_qkv_bias)
        self.o_proj = nn.Linear(spec.q_size, spec.hidden_size, bias=spec.has_o_bias)
        self.gate_up_proj = nn.Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=spec.has_mlp_bias)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=spec.has_mlp_bias)

    def forward(
        self,
        hidden: torch.Tensor,
        rotation: torch.Tensor,
        kv_cache: torch.Tensor,
        batch: AttentionBatch,
        dense_kv: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """rotation: [tokens, 1, head_dim/2] complex; kv_cache: this layer's [blocks, block_size, 2, Hkv, D]."""
        spec = self.spec
        num_tokens, num_heads = hidden.shape[0], spec.num_heads
        qkv = self.qkv_proj(rms_norm(hidden, self.input_layernorm, spec.rms_norm_eps))
        qk = qkv[:, : spec.q_size + spec.kv_size].view(num_tokens, num_heads + spec.num_kv_heads, -1, 2)
        qk = _rotate(qk, rotation).view(num_tokens, num_heads + spec.num_kv_heads, spec.head_dim)
        v = qkv[:, spec.q_size + spec.kv_size :].view(num_tokens, 1, spec.num_kv_heads, spec.head_dim)
        new_kv = torch.cat((qk[:, num_heads:].unsqueeze(1), v), dim=1)
        attention = paged_attention(qk[:, :num_heads], new_kv, kv_cache, batch, dense_kv)
        hidden = hidden + self.o_proj(attention)
        gate, up = self.gate_up_proj(rms_norm(hidden, self.post_attention_layernorm, spec.rms_norm_eps)).chunk(2, -1)
        out: torch.Tensor = hidden + self.down_proj(functional.silu(gate) * up)
        return out


def _rotate(pairs: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved (real, imaginary) pairs [..., D/2, 2] by complex factors, in fp32."""
    if pairs.dtype == torch.float32:
        return torch.view_as_real(torch.view_as_complex(pairs) * rotation)
    rotated = torch.view_as_real(torch.view_as_complex(pairs.float()) * rotation)
    return rotated.to(pairs.dtype)


def to_interleaved_halves(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder q/k projection rows of each head from (first half, second half) to interleaved pairs."""
    rest = tensor.shape[1:]
    return tensor.reshape(num_heads, 2, -1, *rest).transpose(1, 2).reshape(tensor.shape)


class DecoderModel(nn.Module):
    """Token ids in, hidden states out; `compute_logits` applies the final norm and LM head."""

    rope_rotation: torch.Tensor

    def __init__(self, spec: ModelSpec, max_positions: int) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.empty(spec.hidden_size))
        self.lm_head = (
            None if spec.tie_word_embeddings else nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))
        )
        # a plain attribute, not a buffer: Module.to(dtype) would drop its imaginary part
        self.rope_rotation = rotation_table(spec, max_positions)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        batch: AttentionBatch,
        dense_kv: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """kv_cache: [num_layers, num_blocks, block_size, 2, num_kv_heads, head_dim]; dense_kv: per-layer rows."""
        hidden: torch.Tensor = self.embed_tokens(input_ids)
        rotation = self.rope_rotation.index_select(0, positions).unsqueeze(1)
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, rotation, kv_cache[index], batch, None if dense_kv is None else dense_kv[index])
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the selected rows; fp32 logits [rows, vocab]."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head
        return functional.linear(rms_norm(hidden, self.norm, self.spec.rms_norm_eps), weight).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face-named tensors into the fused parameters (casting dtype); returns the names used."""
        loaded: set[str] = set()
        for name, tensor in weights:
            target = self.weight_target(name)
            if target is None:
                continue
            if target.shape != tensor.shape:
                raise WeightLoadError(f"{name}: shape {tuple(tensor.shape)} does not match {tuple(target.shape)}")
            target.copy_(self._to_internal_layout(name, tensor))
            loaded.add(name)
        return loaded

    def _to_internal_layout(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if ".self_attn.q_proj." in name:
            return to_interleaved_halves(tensor, self.spec.num_heads)
        if ".self_attn.k_proj." in name:
            return to_interleaved_halves(tensor, self.spec.num_kv_heads)
        return tensor

    def weight_target(self, name: str) -> torch.Tensor | None:
        """The parameter (slice) an HF tensor name maps to; None for names deliberately skipped.

        Raises WeightLoadError for a name that is not part of this model.
        """
        if name.endswith(_IGNORED_SUFFIXES):
            return None
        if name == "model.embed_tokens.weight":
            return self.embed_tokens.weight
        if name == "model.norm.weight":
            return self.norm
        if name == "lm_head.weight":
            return None if self.lm_head is None else self.lm_head
        match = _LAYER_NAME.match(name)
        if match is None or int(match.group(1)) >= len(self.layers):
            raise WeightLoadError(f"{name} is not a parameter of this {self.spec.model_type} model")
        layer = cast(DecoderLayer, self.layers[int(match.group(1))])
        return _layer_target(layer, match.group(2), name)


def _layer_target(layer: DecoderLayer, local: str, full_name: str) -> torch.Tensor:
    spec = layer.spec
    module, _, kind = local.rpartition(".")
    if local == "input_layernorm.weight":
        return layer.input_layernorm
    if local == "post_attention_layernorm.weight":
        return layer.post_attention_layernorm
    fused: dict[str, tuple[nn.Linear, int, int]] = {
        "self_attn.q_proj": (layer.qkv_proj, 0, spec.q_size),
        "self_attn.k_proj": (layer.qkv_proj, spec.q_size, spec.kv_size),
        "self_attn.v_proj": (layer.qkv_proj, spec.q_size + spec.kv_size, spec.kv_size),
        "mlp.gate_proj": (layer.gate_up_proj, 0, spec.intermediate_size),
        "mlp.up_proj": (layer.gate_up_proj, spec.intermediate_size, spec.intermediate_size),
    }
    plain = {"self_attn.o_proj": layer.o_proj, "mlp.down_proj": layer.down_proj}
    if module in fused and kind in ("weight", "bias"):
        linear, start, size = fused[module]
        param: torch.Tensor | None = getattr(linear, kind)
        if param is not None:
            return param.narrow(0, start, size)
    elif module in plain and kind in ("weight", "bias"):
        param = getattr(plain[module], kind)
        if param is not None:
            return param
    raise WeightLoadError(f"{full_name} is not a parameter of this {spec.model_type} model")


def rotation_table(spec: ModelSpec, max_positions: int) -> torch.Tensor:
    """Complex rotary factors [positions, head_dim/2] (complex64): cos + i*sin, attention factor included."""
    cos, sin = cos_sin_table(spec.rope, spec.head_dim, max_positions)
    return torch.complex(cos, sin)
