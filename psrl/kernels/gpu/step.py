"""The operations one decoder step runs outside its matrix products, and how to get an implementation.

`KernelForward` (psrl.models.kernel_forward) and the decode rounds (psrl.engine.decode_rounds)
call these; `TritonStepKernels` runs them as Triton kernels (CUDA, or Triton's interpreter on a
CPU), `TorchStepKernels` with the model's own torch functions (any device; the eager reference).
"""

from __future__ import annotations

import os
from typing import Literal, Protocol

import structlog
import torch

from psrl.models.attention import PackedPrefill

log = structlog.get_logger(__name__)

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


def load_step_kernels(kind: StepKernelsKind, device: torch.device) -> StepKernels:
    """The Triton kernels (raises StepKernelsUnavailableError without Triton) or the torch reference."""
    if kind == "torch":
        from psrl.kernels.gpu.reference import TorchStepKernels

        return TorchStepKernels()
    try:
        import triton  # noqa: F401
    except ImportError as error:
        raise StepKernelsUnavailableError(
            f"Triton is not installed ({error}); it comes with torch's CUDA wheels"
        ) from None
    from psrl.kernels.gpu.triton_step import TritonStepKernels

    return TritonStepKernels(device)


def check_head_dim(head_dim: int) -> None:
    """The kernels tile a head's dimension in one power-of-two block of at least 16."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise StepKernelsUnavailableError(f"head_dim {head_dim} is not a power of two >= 16")


def resolve_step_kernels(
    mode: GpuKernelsMode, device: torch.device, head_dim: int, *, has_qk_norm: bool = False
) -> StepKernels | None:
    """The step kernels an engine on `device` uses under `engine.gpu_kernels=mode`, or None (the torch path).

    "auto": Triton on CUDA when it imports and covers the model, else a warning and None; "on": Triton
    or an error (on a CPU only under Triton's interpreter, TRITON_INTERPRET=1); "torch": the reference.
    """
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    if has_qk_norm:  # the fused rotary + KV-write step has no per-head query/key norm (Qwen3)
        if mode != "auto":
            raise ValueError(f"engine.gpu_kernels={mode} does not cover per-head q/k norms (Qwen3); use auto or off")
        log.info("gpu_kernels_skipped", reason="the model has per-head q/k norms (Qwen3)", effect="torch path")
        return None
    if mode == "torch":
        return load_step_kernels("torch", device)
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"engine.gpu_kernels=on needs device=cuda (or TRITON_INTERPRET=1), not {device.type}")
    try:
        check_head_dim(head_dim)
        return load_step_kernels("triton", device)
    except StepKernelsUnavailableError as error:
        if mode == "on":
            raise
        log.warning("gpu_kernels_unavailable", reason=str(error), effect="torch prefill and one-step decode (slower)",
                    fix="install triton, or set engine.gpu_kernels=off to silence this")  # fmt: skip
        return None
