"""RMSNorm fused with the residual add, and the SwiGLU activation, in Triton.

Both round exactly where the eager path rounds (bf16 after the add, after the normalisation and
after the weight multiply; after SiLU and after the product), so they match it to the fp32
reduction order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(hidden, delta, weight, normed, size, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < size
    dtype = hidden.dtype.element_ty
    x = tl.load(hidden + row * size + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        d = tl.load(delta + row * size + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(dtype)
        tl.store(hidden + row * size + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inverse_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / size + eps)
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    y = (xf * inverse_rms).to(dtype).to(tl.float32) * w
    tl.store(normed + row * size + cols, y.to(dtype), mask=mask)


@triton.jit
def _silu_mul_kernel(gate_up, out, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    dtype = out.dtype.element_ty
    gate = tl.load(gate_up + row * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up + row * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
    activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out + row * inter + cols, (activated * up).to(dtype), mask=mask)


def add_rms_norm(
    hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, normed: torch.Tensor
) -> None:
    """hidden += delta (when given), in place; normed = RMSNorm(hidden) * weight. All [N, H] contiguous."""
    rows, size = hidden.shape
    block = triton.next_power_of_2(size)
    _add_rms_norm_kernel[(rows,)](
        hidden, hidden if delta is None else delta, weight, normed, size, eps,
        HAS_DELTA=delta is not None, BLOCK=block, num_warps=_warps(block),
    )  # fmt: skip


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [N, 2 I] -> [N, I]."""
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block, num_warps=4)
    return out


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16
