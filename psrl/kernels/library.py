"""The CPU kernel library and the `engine.cpu_kernels` setting: where the kernels apply and what to do without them."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Literal

import structlog

from psrl.kernels.build import KernelBuildError, load_library

log = structlog.get_logger(__name__)

CpuKernelsMode = Literal["auto", "on", "off"]
SOURCES = [Path(__file__).with_name("decode_cpu.c"), Path(__file__).with_name("sample_cpu.c")]


@functools.cache
def cpu_kernel_library() -> ctypes.CDLL:
    """The kernels, compiled on first use; raises KernelBuildError where this machine cannot build them."""
    return load_library("psrl_cpu", SOURCES)


def resolve_cpu_kernels(mode: CpuKernelsMode, device_type: str) -> ctypes.CDLL | None:
    """The library for an engine on `device_type`, or None where the kernels are off or do not apply.

    "auto" warns (once per engine) and returns None when the kernels cannot be built; "on" raises
    instead, and also refuses a device the kernels do not run on.
    """
    if mode == "off":
        return None
    if device_type != "cpu":
        if mode == "on":
            raise ValueError(f"engine.cpu_kernels=on needs device=cpu, not {device_type}")
        return None
    try:
        return cpu_kernel_library()
    except KernelBuildError as error:
        if mode == "on":
            raise
        log.warning("cpu_kernels_unavailable", reason=str(error), effect="eager torch decode and sampling (slower)",
                    fix="install a C compiler (gcc), or set engine.cpu_kernels=off to silence this")  # fmt: skip
        return None
