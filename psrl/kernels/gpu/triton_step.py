"""`StepKernels` implemented with the Triton kernels of this package."""

from __future__ import annotations

import torch

from psrl.kernels.gpu import triton_decode_attention, triton_norm, triton_prefill_attention, triton_rotary
from psrl.kernels.gpu.triton_sample import sample as triton_sample
from psrl.kernels.packed import PackedPrefill

# the interpreter (no CUDA) runs programs one after another; any count gives the same results
INTERPRETER_SMS = 4


class TritonStepKernels:
    name = "triton"

    def __init__(self, device: torch.device) -> None:
        self.num_sms = (
            torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else INTERPRETER_SMS
        )

    def add_rms_norm(
        self, hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, normed: torch.Tensor
    ) -> None:
        triton_norm.add_rms_norm(hidden, delta, weight, eps, normed)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return triton_norm.silu_mul(gate_up)

    def rotary_kv_write(
        self,
        qkv: torch.Tensor,
        rope: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache: torch.Tensor,
        num_heads: int,
    ) -> None:
        triton_rotary.rotary_kv_write(qkv, rope, positions, slots, cache, num_heads, cache.shape[3])

    def decode_slots(
        self,
        positions: torch.Tensor,
        step: int,
        tables: torch.Tensor,
        num_blocks: torch.Tensor,
        geometry: tuple[int, int, int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return triton_rotary.decode_slots(positions, step, tables, num_blocks, *geometry)

    def decode_attention(
        self, qkv: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor, seq_lens: torch.Tensor, num_heads: int
    ) -> torch.Tensor:
        splits = triton_decode_attention.num_splits(qkv.shape[0], cache.shape[3], self.num_sms)
        return triton_decode_attention.decode_attention(qkv, cache, tables, seq_lens, num_heads, splits)

    def prefill_attention(
        self, qkv: torch.Tensor, cache: torch.Tensor, prefill: PackedPrefill, num_heads: int
    ) -> torch.Tensor:
        tiles = triton_prefill_attention.prefill_tiles(prefill.query_lens_list, qkv.device)
        return triton_prefill_attention.prefill_attention(
            qkv, cache, prefill.block_tables, prefill.query_starts, prefill.query_lens, prefill.context_starts,
            tiles, num_heads,
        )  # fmt: skip

    def sample(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        seeds: torch.Tensor,
        counters: torch.Tensor,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
    ) -> None:
        triton_sample(logits, temperatures, seeds, counters, tokens, logprobs)
