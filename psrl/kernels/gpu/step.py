"""The operations one decoder step runs outside its matrix products, and how to get an implementation.

`KernelForward` (psrl.models.kernel_forward) and the decode rounds (psrl.engine.decode_rounds)
call these; `TritonStepKernels` runs them as Triton kernels (CUDA, or Triton's interpreter on a
CPU), `TorchStepKernels` (psrl.models.reference_step) with the model's own torch functions (any
device; the eager reference); psrl.models.step_kernels chooses.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch

from psrl.kernels.packed import PackedPrefill

StepKernelsKind = Literal["triton", "torch"]
GpuKernelsMode = Literal["auto", "on", "off", "torch"]


class StepKernels(Protocol):
    name: str

    def add_rms_norm(
        self, hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, normed: torch.Tensor
    ) -> None:
        """hidden += delta (when given), in place; normed = RMSNorm(hidden) * weight."""

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up [N, 2 I] -> [N, I]."""

    def rotary_kv_write(
        self,
        qkv: torch.Tensor,
        rope: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache: torch.Tensor,
        num_heads: int,
    ) -> None:
        """Rotate q in place inside qkv [N, (Hq + 2 Hkv) D]; write rotated k and v into this layer's cache."""

    def decode_slots(
        self,
        positions: torch.Tensor,
        step: int,
        tables: torch.Tensor,
        num_blocks: torch.Tensor,
        geometry: tuple[int, int, int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step `step` of a round: (positions + step clamped to the context, cache slots, attended lengths).

        geometry: (block size, scratch block, context length). Positions outside a row's `num_blocks`
        blocks write to the scratch block, and attention never reads past them.
        """

    def decode_attention(
        self, qkv: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor, seq_lens: torch.Tensor, num_heads: int
    ) -> torch.Tensor:
        """One query per row: attention over the first seq_lens[row] positions of tables[row] -> [B, Hq * D]."""

    def prefill_attention(
        self, qkv: torch.Tensor, cache: torch.Tensor, prefill: PackedPrefill, num_heads: int
    ) -> torch.Tensor:
        """Causal attention of the packed new tokens over their sequences' cached context -> [N, Hq * D]."""

    def sample(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        seeds: torch.Tensor,
        counters: torch.Tensor,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
    ) -> None:
        """Gumbel-max sampling with counter-based draws (psrl.kernels.gpu.triton_sample) into tokens, logprobs."""


class StepKernelsUnavailableError(RuntimeError):
    """The requested step kernels cannot run here (no Triton, or a model shape they do not cover)."""


def check_head_dim(head_dim: int) -> None:
    """The kernels tile a head's dimension in one power-of-two block of at least 16."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise StepKernelsUnavailableError(f"head_dim {head_dim} is not a power of two >= 16")
