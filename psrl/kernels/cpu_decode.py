"""Typed entry points of the fused fp32 CPU decode kernels (decode_cpu.c), called through ctypes.

The checked methods verify what the C code relies on (fp32, contiguous, on the CPU, sizes) before
handing it raw pointers, so a mistake raises here instead of corrupting memory. A caller that
runs many calls per step on tensors it has validated once (psrl.models.fused_decode) uses the
`raw_*` functions directly: at a few microseconds per kernel, per-call checks would cost more
than the kernels.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from psrl.kernels.build import KernelBuildError

ABI_VERSION = 2

_POINTER, _INT64, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _DecodeShape(ctypes.Structure):
    _fields_ = (
        ("num_seqs", _INT64),
        ("num_heads", _INT64),
        ("num_kv_heads", _INT64),
        ("head_dim", _INT64),
        ("qkv_stride", _INT64),
        ("capacity", _INT64),
        ("scale", _FLOAT),
    )


@dataclass(frozen=True, slots=True)
class AttentionShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int


class CpuDecodeKernels:
    def __init__(self, library: ctypes.CDLL) -> None:
        if library.psrl_kernels_abi_version() != ABI_VERSION:
            raise KernelBuildError(f"kernel library ABI {library.psrl_kernels_abi_version()} != {ABI_VERSION}")
        # (x, weight, out, rows, dim, eps)
        self.raw_rms_norm = library.psrl_rms_norm
        self.raw_rms_norm.argtypes = (_POINTER, _POINTER, _POINTER, _INT64, _INT64, _FLOAT)
        self.raw_rms_norm.restype = None
        # (gate_up, out, rows, inter)
        self.raw_silu_mul = library.psrl_silu_mul
        self.raw_silu_mul.argtypes = (_POINTER, _POINTER, _INT64, _INT64)
        self.raw_silu_mul.restype = None
        # (qkv, rope, positions, slots, cache, keys, values, out, shape) -> 0 or -1 (out of memory)
        self.raw_attention = library.psrl_decode_attention
        self.raw_attention.argtypes = (*[_POINTER] * 8, ctypes.POINTER(_DecodeShape))
        self.raw_attention.restype = ctypes.c_int

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [rows, dim] -> weight * x / rms(x)."""
        check_tensor(x, "x")
        check_tensor(weight, "weight")
        if weight.numel() != x.shape[-1]:
            raise ValueError(f"rms_norm weight has {weight.numel()} entries for rows of {x.shape[-1]}")
        out = torch.empty_like(x)
        self.raw_rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [rows, 2 * inter] -> silu(gate) * up [rows, inter]."""
        check_tensor(gate_up, "gate_up")
        rows, width = gate_up.shape
        out = gate_up.new_empty(rows, width // 2)
        self.raw_silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
        return out

    def decode_attention(
        self, qkv: torch.Tensor, batch: DecodeBatch, cache: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        """Rotate q/k, store the new key/value (paged cache, and workspace row b for batch row b), attend.

        qkv [B, (Hq + 2 Hkv) D] -> [B, Hq * D]; one layer's cache [slots, 2, Hkv, D] and workspace keys
        and values [rows, Hkv, capacity, D], of the sizes `batch` was prepared for.
        """
        check_tensor(qkv, "qkv")
        if qkv.shape != (batch.num_seqs, batch.qkv_size):
            raise ValueError(f"qkv {tuple(qkv.shape)} != ({batch.num_seqs}, {batch.qkv_size})")
        batch.check_layer_tensors(cache, keys, values)
        out = qkv.new_empty(batch.num_seqs, batch.shape.num_heads * batch.shape.head_dim)
        status = self.raw_attention(
            qkv.data_ptr(), batch.rope.data_ptr(), batch.positions.data_ptr(), batch.slots.data_ptr(),
            cache.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(), batch.c_shape_ref,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("decode attention could not allocate its scratch memory")
        return out


class DecodeBatch:
    """One decode step's per-token inputs, checked once and shared by every layer's attention call.

    rope: [positions, D/2, 2] fp32 (cos, sin); positions[b]: position of batch row b's new token,
    which attends to positions 0..positions[b]; slots[b]: the paged-cache slot it is written to.
    """

    def __init__(
        self,
        shape: AttentionShape,
        rope: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        capacity: int,
        num_cache_slots: int,
    ) -> None:
        heads, kv_heads, dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
        check_tensor(rope, "rope")
        if heads % kv_heads or rope.shape[1:] != (dim // 2, 2):
            raise ValueError(f"rope {tuple(rope.shape)} does not fit {shape}")
        for tensor, name in ((positions, "positions"), (slots, "slots")):
            if tensor.dtype != torch.int64 or tensor.device.type != "cpu" or not tensor.is_contiguous():
                raise ValueError(f"{name} must be a contiguous int64 CPU tensor")
        if positions.shape != slots.shape or positions.dim() != 1:
            raise ValueError(f"positions {tuple(positions.shape)} and slots {tuple(slots.shape)} must be [B]")
        if positions.numel():
            _check_range(positions, "positions", min(capacity, rope.shape[0]))
            _check_range(slots, "cache slots", num_cache_slots)
        self.shape, self.rope, self.num_seqs = shape, rope, positions.numel()
        self.positions, self.slots = positions, slots
        self.capacity, self.num_cache_slots = capacity, num_cache_slots
        self.qkv_size = (heads + 2 * kv_heads) * dim
        self._c_shape = _DecodeShape(self.num_seqs, heads, kv_heads, dim, self.qkv_size, capacity, dim**-0.5)
        self.c_shape_ref = ctypes.byref(self._c_shape)

    def check_layer_tensors(self, cache: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """One layer's paged cache [.., 2, Hkv, D] and workspace keys/values [rows >= B, Hkv, capacity, D]."""
        for tensor, name in ((cache, "cache"), (keys, "keys"), (values, "values")):
            check_tensor(tensor, name)
        kv_heads, dim = self.shape.num_kv_heads, self.shape.head_dim
        if cache.numel() != self.num_cache_slots * 2 * kv_heads * dim:
            raise ValueError(f"cache {tuple(cache.shape)} does not hold {self.num_cache_slots} slots")
        expected = (kv_heads, self.capacity, dim)
        if keys.shape[0] < self.num_seqs or keys.shape[1:] != expected:
            raise ValueError(f"workspace keys {tuple(keys.shape)} do not fit [>={self.num_seqs}, {expected}]")
        if values.shape != keys.shape:
            raise ValueError(f"workspace values {tuple(values.shape)} do not match keys {tuple(keys.shape)}")


def check_tensor(tensor: torch.Tensor, name: str) -> None:
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"{name}: the CPU kernels need a contiguous float32 CPU tensor, got "
                         f"{tensor.dtype} on {tensor.device}, contiguous={tensor.is_contiguous()}")  # fmt: skip


def _check_range(values: torch.Tensor, name: str, limit: int) -> None:
    low, high = torch.aminmax(values)
    if int(low) < 0 or int(high) >= limit:
        raise ValueError(f"{name} must lie in [0, {limit}), got {int(low)}..{int(high)}")
