"""Llama / Qwen2 / Qwen3-family decoder for inference: fused projections, RMSNorm, RoPE, GQA, SwiGLU.

One class covers the families; the differences (qkv bias, MLP bias, tied embeddings, RoPE
scaling, Qwen3's per-head q/k RMSNorm) come from `ModelSpec`. Projections are fused (q|k|v and
gate|up) so a layer runs four matmuls; `load_weights` maps Hugging Face parameter names onto the fused slices.

Projection weights are stored transposed ([in, out]), and the q and k projections with each
head's two halves interleaved, so the rotary embedding is one complex multiply instead of a dozen
elementwise ops (attention scores are unchanged: q and k get the same permutation of their head
dimension). `psrl.models.weights` maps Hugging Face names and layouts onto these parameters.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.nn import functional

from psrl.models.attention import AttentionBatch, paged_attention
from psrl.models.rope import cos_sin_table
from psrl.models.spec import ModelSpec
from psrl.models.weights import WeightLoadError, WeightSlot, weight_slots


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 and cast back before the weight multiply, as the reference does."""
    if x.dtype == torch.float32:
        return functional.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = functional.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return weight * normed.to(x.dtype)


class Projection(nn.Module):
    """x @ W^T + b with W stored transposed ([in, out]): small-batch matmuls run 25-40% faster on CPU.

    Unmerged LoRA (``psrl.engine.lora_unmerged``) sets ``lora_a_t`` [in, ranks] and ``lora_b_t`` [ranks, out]
    (the scale folded into B) and the projection adds ``(x @ lora_a_t) @ lora_b_t``; plain attributes, not
    parameters, so state dicts and weight loading do not see them."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.lora_a_t: torch.Tensor | None = None
        self.lora_b_t: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.mm(x, self.weight_t) if self.bias is None else torch.addmm(self.bias, x, self.weight_t)
        if self.lora_a_t is not None and self.lora_b_t is not None:
            out.addmm_(torch.mm(x, self.lora_a_t), self.lora_b_t)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.input_layernorm = nn.Parameter(torch.empty(spec.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.empty(spec.hidden_size))
        qkv_size = spec.q_size + 2 * spec.kv_size
        self.qkv_proj = Projection(spec.hidden_size, qkv_size, bias=spec.has_qkv_bias)
        self.o_proj = Projection(spec.q_size, spec.hidden_size, bias=spec.has_o_bias)
        self.gate_up_proj = Projection(spec.hidden_size, 2 * spec.intermediate_size, bias=spec.has_mlp_bias)
        self.down_proj = Projection(spec.intermediate_size, spec.hidden_size, bias=spec.has_mlp_bias)
        # Qwen3: RMSNorm over each query / key head before the rotary embedding (weights interleaved like q and k)
        self.q_norm = nn.Parameter(torch.empty(spec.head_dim)) if spec.has_qk_norm else None
        self.k_norm = nn.Parameter(torch.empty(spec.head_dim)) if spec.has_qk_norm else None

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
        num_qk_heads = num_heads + spec.num_kv_heads
        qk = qkv[:, : spec.q_size + spec.kv_size].view(num_tokens, num_qk_heads, spec.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = rms_norm(qk[:, :num_heads], self.q_norm, spec.rms_norm_eps)
            qk = torch.cat((q, rms_norm(qk[:, num_heads:], self.k_norm, spec.rms_norm_eps)), 1)
        qk = rotate_pairs(qk.view(num_tokens, num_qk_heads, -1, 2), rotation).view(
            num_tokens, num_qk_heads, spec.head_dim
        )
        v = qkv[:, spec.q_size + spec.kv_size :].view(num_tokens, 1, spec.num_kv_heads, spec.head_dim)
        new_kv = torch.cat((qk[:, num_heads:].unsqueeze(1), v), dim=1)
        attention = paged_attention(qk[:, :num_heads], new_kv, kv_cache, batch, dense_kv)
        hidden = hidden + self.o_proj(attention)
        gate, up = self.gate_up_proj(rms_norm(hidden, self.post_attention_layernorm, spec.rms_norm_eps)).chunk(2, -1)
        out: torch.Tensor = hidden + self.down_proj(functional.silu(gate) * up)
        return out


def rotate_pairs(pairs: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved (real, imaginary) pairs [..., D/2, 2] by complex factors, in fp32."""
    if pairs.dtype == torch.float32:
        return torch.view_as_real(torch.view_as_complex(pairs) * rotation)
    rotated = torch.view_as_real(torch.view_as_complex(pairs.float()) * rotation)
    return rotated.to(pairs.dtype)


class DecoderModel(nn.Module):
    """Token ids in, hidden states out; `compute_logits` applies the final norm and LM head."""

    rope_rotation: torch.Tensor

    def __init__(self, spec: ModelSpec, max_positions: int) -> None:
        super().__init__()
        self.spec = spec
        # an explicit weight skips Embedding's random init: on the meta device that init alone costs
        # seconds of lazy imports at every engine start, for values the checkpoint overwrites
        self.embed_tokens = nn.Embedding(
            spec.vocab_size, spec.hidden_size, _weight=torch.empty(spec.vocab_size, spec.hidden_size)
        )
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.empty(spec.hidden_size))
        # [hidden, vocab]; with tied embeddings, a transposed copy kept in step by load_weights
        self.lm_head_t = nn.Parameter(torch.empty(spec.hidden_size, spec.vocab_size))
        # a plain attribute, not a buffer: Module.to(dtype) would drop its imaginary part
        if torch.get_default_device().type == "meta":
            # built on the meta device (the loader), the table would go through torch's Python reference
            # kernels, whose first use imports its compiler stack (a second at every engine start); the loader
            # computes the real table once the model is on its device
            self.rope_rotation = torch.empty(max_positions, spec.head_dim // 2, dtype=torch.complex64)
        else:
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
        return torch.mm(rms_norm(hidden, self.norm, self.spec.rms_norm_eps), self.lm_head_t).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face-named tensors into the fused parameters (casting dtype); returns the names used.

        Raises WeightLoadError for an unknown name or a wrong shape (tensors before it are already copied;
        callers that need all-or-nothing check first with `check_weight`).
        """
        loaded: set[str] = set()
        device = self.embed_tokens.weight.device
        for name, tensor in weights:
            slots = self.check_weight(name, tensor)
            # Move once, then reorder on the device: a reordering copy across devices would make the
            # host lay the bytes out first (a slow strided copy), once per slot.
            on_device = tensor.to(device) if slots else tensor
            for slot in slots:
                slot.copy_from(on_device)
            loaded.add(name)
        return loaded

    def check_weight(self, name: str, tensor: torch.Tensor) -> list[WeightSlot]:
        """Where an HF tensor goes (empty for names deliberately skipped); raises WeightLoadError."""
        slots = weight_slots(self, name)
        for slot in slots:
            if slot.hf_shape != tuple(tensor.shape):
                raise WeightLoadError(f"{name}: shape {tuple(tensor.shape)} does not match {slot.hf_shape}")
        return slots


def rotation_table(spec: ModelSpec, max_positions: int) -> torch.Tensor:
    """Complex rotary factors [positions, head_dim/2] (complex64): cos + i*sin, attention factor included."""
    cos, sin = cos_sin_table(spec.rope, spec.head_dim, max_positions)
    return torch.complex(cos, sin)
