"""Typed entry point of the fused CPU sampling kernel (sample_cpu.c), called through ctypes."""

from __future__ import annotations

import array
import ctypes

import torch

from psrl.kernels.build import KernelBuildError
from psrl.kernels.cpu_decode import check_tensor

ABI_VERSION = 1

_POINTER, _INT64 = ctypes.c_void_p, ctypes.c_int64


class CpuSampleKernel:
    def __init__(self, library: ctypes.CDLL) -> None:
        if library.psrl_sample_abi_version() != ABI_VERSION:
            raise KernelBuildError(f"sampling kernel ABI {library.psrl_sample_abi_version()} != {ABI_VERSION}")
        self._sample = library.psrl_sample
        self._sample.argtypes = (_POINTER, _INT64, _INT64, _POINTER, _POINTER, _POINTER, _POINTER)
        self._sample.restype = ctypes.c_int

    def sample(
        self, logits: torch.Tensor, temperatures: list[float], uniforms: torch.Tensor | None
    ) -> tuple[list[int], list[float]]:
        """One token per row of logits [rows, vocab] (fp32, CPU) and its log-probability.

        temperatures: per row, 0 = greedy; uniforms: float64 [rows] draws in [0, 1), or None when every
        row is greedy. Per-row values travel in `array` buffers: at this size, cheaper than tensors or ctypes arrays.
        """
        rows, vocab = logits.shape
        check_tensor(logits, "logits")
        if len(temperatures) != rows:
            raise ValueError(f"{len(temperatures)} temperatures for {rows} rows")
        if uniforms is None:
            if any(t > 0 for t in temperatures):
                raise ValueError("sampled rows need uniform draws")
            uniforms = torch.zeros(rows, dtype=torch.float64)
        if uniforms.dtype != torch.float64 or uniforms.numel() != rows or not uniforms.is_contiguous():
            raise ValueError(f"uniforms must be {rows} contiguous float64 values")
        temperature_array = array.array("f", temperatures)
        token_ids, logprobs = array.array("q", bytes(8 * rows)), array.array("f", bytes(4 * rows))
        status = self._sample(logits.data_ptr(), rows, vocab, _address(temperature_array), uniforms.data_ptr(),
                              _address(token_ids), _address(logprobs))  # fmt: skip
        if status != 0:
            raise MemoryError("sampling could not allocate its scratch memory")
        chosen = token_ids.tolist()
        if -1 in chosen:
            raise ValueError(f"row {chosen.index(-1)} of the logits has no finite value to sample from")
        return chosen, logprobs.tolist()


def _address(values: array.array) -> int:  # type: ignore[type-arg]
    address: int = values.buffer_info()[0]
    return address
