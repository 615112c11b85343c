"""Which step kernels an engine runs: Triton's, the models' own torch reference, or none.

The choice sits above both implementations (the kernels in psrl.kernels.gpu, the reference built
from the models' torch functions in psrl.models.reference_step).
"""

from __future__ import annotations

import os

import structlog
import torch

from psrl.kernels.gpu.step import (
    GpuKernelsMode,
    StepKernels,
    StepKernelsKind,
    StepKernelsUnavailableError,
    check_head_dim,
)

log = structlog.get_logger(__name__)


def load_step_kernels(kind: StepKernelsKind, device: torch.device) -> StepKernels:
    """The Triton kernels (raises StepKernelsUnavailableError without Triton) or the torch reference."""
    if kind == "torch":
        from psrl.models.reference_step import TorchStepKernels

        return TorchStepKernels()
    try:
        import triton  # noqa: F401
    except ImportError as error:
        raise StepKernelsUnavailableError(
            f"Triton is not installed ({error}); it comes with torch's CUDA wheels"
        ) from None
    from psrl.kernels.gpu.triton_step import TritonStepKernels

    return TritonStepKernels(device)


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
