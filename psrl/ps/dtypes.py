"""Dtype names on the wire and byte views of tensors (bfloat16 included, which numpy lacks)."""

from __future__ import annotations

import warnings

import torch

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class DtypeError(ValueError):
    """A dtype that cannot travel through the parameter server."""


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise DtypeError(f"unsupported dtype {name!r}; supported: {sorted(_DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _NAMES[dtype]
    except KeyError:
        raise DtypeError(f"unsupported dtype {dtype}; supported: {sorted(_DTYPES)}") from None


def itemsize_of(name: str) -> int:
    return torch.empty((), dtype=dtype_from_name(name)).element_size()


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview over the bytes of a contiguous CPU tensor (no copy)."""
    if tensor.device.type != "cpu":
        raise DtypeError(f"byte_view needs a CPU tensor, got {tensor.device}")
    if not tensor.is_contiguous():
        raise DtypeError("byte_view needs a contiguous tensor")
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(bytearray())
    return flat.view(torch.uint8).numpy().data


def tensor_from_buffer(buffer: memoryview, dtype: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """A tensor viewing ``buffer`` (no copy); the buffer must stay alive as long as the tensor.

    A read-only buffer (a pinned shared-memory pull) gives a tensor its readers only read: torch
    warns that writes would be undefined, and writing to it would fault instead of corrupting.
    """
    torch_dtype = dtype_from_name(dtype)
    if len(buffer) == 0:
        out = torch.empty(0, dtype=torch_dtype)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
            out = torch.frombuffer(buffer, dtype=torch_dtype)
    return out if shape is None else out.reshape(shape)


def copy_bytes(destination: memoryview, source: memoryview) -> None:
    """``destination[:] = source`` through torch, whose copy of large buffers runs on all its threads."""
    if len(destination) != len(source):
        raise ValueError(f"copy of {len(source)} bytes into {len(destination)}")
    if len(source):
        torch.frombuffer(destination, dtype=torch.uint8).copy_(torch.frombuffer(source, dtype=torch.uint8))
