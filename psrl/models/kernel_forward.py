"""The decoder's forward pass through step kernels (psrl.kernels.gpu): the embedded engine's GPU path.

Same model, same parameters, same rounding points as `DecoderModel.forward`; what differs is how
the work between the four projections of a layer runs: the residual add fused into the next
RMSNorm, rotary embedding fused with the KV-cache write, one SwiGLU kernel, and paged attention
kernels that read the block cache directly (decode: one query per sequence; prefill: packed
sequences of any length). Projections stay the model's own modules (cuBLAS on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional

from psrl.kernels.gpu.step import StepKernels, check_head_dim
from psrl.models.llama import DecoderLayer, DecoderModel

# (this layer's qkv [N, (Hq + 2 Hkv) D] with rotated q, this layer's cache) -> attention output [N, Hq * D]
Attend = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class KernelForward:
    def __init__(self, model: DecoderModel, kernels: StepKernels) -> None:
        """Raises StepKernelsUnavailableError for a model shape the kernels do not cover."""
        check_head_dim(model.spec.head_dim)
        self.model = model
        self.kernels = kernels
        self.num_heads = model.spec.num_heads
        self.eps = model.spec.rms_norm_eps
        # (cos, sin) pairs [positions, head_dim / 2, 2] sharing the complex table's memory
        self.rope = torch.view_as_real(model.rope_rotation)

    def final_hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv_cache: torch.Tensor,
        attend: Attend,
    ) -> torch.Tensor:
        """Normed final hidden states [N, hidden] (the LM head's input), writing each layer's new keys/values."""
        kernels = self.kernels
        hidden = functional.embedding(input_ids, self.model.embed_tokens.weight)
        normed = torch.empty_like(hidden)
        delta: torch.Tensor | None = None
        for index, module in enumerate(self.model.layers):
            layer: DecoderLayer = module  # type: ignore[assignment]
            kernels.add_rms_norm(hidden, delta, layer.input_layernorm, self.eps, normed)
            qkv = layer.qkv_proj(normed)
            kernels.rotary_kv_write(qkv, self.rope, positions, slots, kv_cache[index], self.num_heads)
            attention = attend(qkv, kv_cache[index])
            kernels.add_rms_norm(hidden, layer.o_proj(attention), layer.post_attention_layernorm, self.eps, normed)
            delta = layer.down_proj(kernels.silu_mul(layer.gate_up_proj(normed)))
        kernels.add_rms_norm(hidden, delta, self.model.norm, self.eps, normed)
        return normed

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """LM head on normed hidden rows, in the model's dtype [rows, vocab]."""
        return torch.mm(normed, self.model.lm_head_t)
