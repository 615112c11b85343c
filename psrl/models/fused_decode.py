"""A decode step of `DecoderModel` on the CPU with the fused kernels of psrl.kernels.cpu_decode.

Per layer: RMSNorm (kernel), the q|k|v matmul, rotary embedding + cache writes + attention (one
kernel), the output projection accumulated onto the residual in place (addmm_), RMSNorm
(kernel), the gate|up matmul, silu * up (kernel), the down projection accumulated onto the
residual. That is eight calls a layer where the eager path runs about thirty, which is what a
step of a small model costs on a CPU. Everything is checked once per step, intermediate buffers
are allocated once per step and reused by every layer, and the weights are read from tensors
collected at construction (weight loads copy into them in place). fp32 only; the numbers match
the eager path to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional

from psrl.kernels.cpu_decode import AttentionShape, CpuDecodeKernels, DecodeBatch, check_tensor
from psrl.models.llama import DecoderLayer, DecoderModel


@dataclass(frozen=True, slots=True)
class _LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [hidden, q + 2 kv], as Projection stores it
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    q_norm: torch.Tensor | None = None  # Qwen3's per-head query / key norms
    k_norm: torch.Tensor | None = None
    # unmerged LoRA: projection ("qkv", "o", "gate_up", "down") -> (A^T, scaled B^T), as Projection holds them
    lora: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _StepBuffers:
    normed: torch.Tensor  # [B, hidden]
    qkv: torch.Tensor  # [B, q + 2 kv]
    attention: torch.Tensor  # [B, q]
    gate_up: torch.Tensor  # [B, 2 inter]
    activation: torch.Tensor  # [B, inter]


class FusedCpuDecoder:
    def __init__(self, model: DecoderModel, kernels: CpuDecodeKernels) -> None:
        spec = model.spec
        self.model = model
        self.kernels = kernels
        self.shape = AttentionShape(spec.num_heads, spec.num_kv_heads, spec.head_dim)
        self.eps = spec.rms_norm_eps
        self.rope = torch.view_as_real(model.rope_rotation)  # (cos, sin) pairs sharing the complex table's memory
        self.layers = tuple(_layer_weights(layer) for layer in model.layers)  # type: ignore[arg-type]
        self.final_norm, self.lm_head = model.norm.detach(), model.lm_head_t.detach()
        self.embedding = model.embed_tokens.weight.detach()
        for name, tensor in (("norm", self.final_norm), ("lm_head", self.lm_head), ("embedding", self.embedding)):
            check_tensor(tensor, name)

    @torch.inference_mode()
    def logits(
        self,
        packed: torch.Tensor,
        kv_cache: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        """fp32 logits [B, vocab] for one new token per sequence.

        packed: int64 [3 * B] = input ids, positions, cache slots; kv_cache [layers, .., 2, Hkv, D] and the
        workspace keys/values [layers, rows, Hkv, capacity, D] are stacked over layers.
        """
        num_seqs = packed.numel() // 3
        input_ids, positions, slots = packed[:num_seqs], packed[num_seqs : 2 * num_seqs], packed[2 * num_seqs :]
        num_cache_slots = kv_cache[0].numel() // (2 * self.shape.num_kv_heads * self.shape.head_dim)
        batch = DecodeBatch(self.shape, self.rope, positions, slots, keys.shape[3], num_cache_slots)
        batch.check_layer_tensors(kv_cache[0], keys[0], values[0])
        if not (kv_cache.shape[0] == keys.shape[0] == values.shape[0] == len(self.layers)):
            raise ValueError(f"cache and workspace must stack {len(self.layers)} layers")
        hidden = functional.embedding(input_ids, self.embedding)
        buffers = self._buffers(num_seqs)
        for index, layer in enumerate(self.layers):
            self._attention_block(hidden, layer, batch, buffers, (kv_cache[index], keys[index], values[index]))
            self._mlp_block(hidden, layer, buffers)
        self._rms_norm(hidden, self.final_norm, buffers.normed)
        return torch.mm(buffers.normed, self.lm_head)

    def _attention_block(
        self,
        hidden: torch.Tensor,
        layer: _LayerWeights,
        batch: DecodeBatch,
        buffers: _StepBuffers,
        caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> None:
        self._rms_norm(hidden, layer.input_norm, buffers.normed)
        _project(buffers.normed, layer.qkv, layer.qkv_bias, buffers.qkv, layer.lora.get("qkv"))
        if layer.q_norm is not None and layer.k_norm is not None:
            self._qk_norm(buffers.qkv, layer.q_norm, layer.k_norm)
        cache, keys, values = caches
        status = self.kernels.raw_attention(
            buffers.qkv.data_ptr(), self.rope.data_ptr(), batch.positions.data_ptr(), batch.slots.data_ptr(),
            cache.data_ptr(), keys.data_ptr(), values.data_ptr(), buffers.attention.data_ptr(), batch.c_shape_ref,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("decode attention could not allocate its scratch memory")
        _accumulate(hidden, buffers.attention, layer.o, layer.o_bias, layer.lora.get("o"))

    def _mlp_block(self, hidden: torch.Tensor, layer: _LayerWeights, buffers: _StepBuffers) -> None:
        self._rms_norm(hidden, layer.post_norm, buffers.normed)
        _project(buffers.normed, layer.gate_up, layer.gate_up_bias, buffers.gate_up, layer.lora.get("gate_up"))
        rows, inter = buffers.activation.shape
        self.kernels.raw_silu_mul(buffers.gate_up.data_ptr(), buffers.activation.data_ptr(), rows, inter)
        _accumulate(hidden, buffers.activation, layer.down, layer.down_bias, layer.lora.get("down"))

    def _qk_norm(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor) -> None:
        """Normalise each query and key head in place, before the attention kernel rotates them."""
        shape, rows = self.shape, qkv.shape[0]
        q_size = shape.num_heads * shape.head_dim
        for start, heads, weight in ((0, shape.num_heads, q_norm), (q_size, shape.num_kv_heads, k_norm)):
            part = qkv[:, start : start + heads * shape.head_dim].view(rows, heads, shape.head_dim)
            part.copy_(functional.rms_norm(part, (shape.head_dim,), weight, self.eps))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
        self.kernels.raw_rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], self.eps)

    def _buffers(self, num_seqs: int) -> _StepBuffers:
        first = self.layers[0]
        return _StepBuffers(
            normed=torch.empty(num_seqs, first.qkv.shape[0]),
            qkv=torch.empty(num_seqs, first.qkv.shape[1]),
            attention=torch.empty(num_seqs, first.o.shape[0]),
            gate_up=torch.empty(num_seqs, first.gate_up.shape[1]),
            activation=torch.empty(num_seqs, first.down.shape[0]),
        )


def _layer_weights(layer: DecoderLayer) -> _LayerWeights:
    """The layer's parameters as plain tensors, checked once (fp32, contiguous, CPU)."""
    tensors: dict[str, torch.Tensor | None] = {
        "input_norm": layer.input_layernorm.detach(),
        "post_norm": layer.post_attention_layernorm.detach(),
    }
    projections = (
        ("qkv", layer.qkv_proj),
        ("o", layer.o_proj),
        ("gate_up", layer.gate_up_proj),
        ("down", layer.down_proj),
    )
    lora: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for short, projection in projections:
        tensors[short] = projection.weight_t.detach()
        tensors[f"{short}_bias"] = None if projection.bias is None else projection.bias.detach()
        if projection.lora_a_t is not None and projection.lora_b_t is not None:
            lora[short] = (projection.lora_a_t, projection.lora_b_t)
    tensors["q_norm"] = None if layer.q_norm is None else layer.q_norm.detach()
    tensors["k_norm"] = None if layer.k_norm is None else layer.k_norm.detach()
    for name, tensor in tensors.items():
        if tensor is not None:
            check_tensor(tensor, name)
    return _LayerWeights(**tensors, lora=lora)  # type: ignore[arg-type]


def _project(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    lora: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    if bias is None:
        torch.mm(x, weight, out=out)
    else:
        torch.addmm(bias, x, weight, out=out)
    if lora is not None:
        out.addmm_(torch.mm(x, lora[0]), lora[1])


def _accumulate(
    residual: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    lora: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """residual += x @ weight (+ bias) (+ x @ A^T @ B^T under unmerged LoRA), in place."""
    residual.addmm_(x, weight)
    if bias is not None:
        residual.add_(bias)
    if lora is not None:
        residual.addmm_(torch.mm(x, lora[0]), lora[1])
