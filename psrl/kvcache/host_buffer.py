"""Host buffers for KV bytes, backed by transparent huge pages where the kernel grants them.

The offload tier's buffer is what NIXL writes into and reads from and what engines copy blocks
to and from. A copy between processes (UCX's cma transport: the kernel pins and maps the pages of
both sides) costs per page as much as per byte at 4 KiB pages; with 2 MiB pages the same writes run
1.5-2x faster here (measured in tools/bench_kv_transfer.py, which gives its raw baselines the same
memory). Most kernels leave huge pages to ``madvise`` (``/sys/kernel/mm/transparent_hugepage/enabled``),
so the buffer is aligned to 2 MiB and advised. Pages still become resident only when first touched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from pathlib import Path

import structlog
import torch

log = structlog.get_logger(__name__)
HUGE_PAGE_BYTES = 2 << 20
MADV_HUGEPAGE = 14  # linux/mman.h
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# cudaHostRegister flags: portable to every context; read-only for mappings opened without write access
# (pinning a copy-on-write mapping would otherwise copy its pages)
HOST_REGISTER_PORTABLE, HOST_REGISTER_READ_ONLY = 0x01, 0x08


def huge_page_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of uninitialised host memory (uint8), 2 MiB aligned and advised to use huge pages."""
    whole = torch.empty(nbytes + HUGE_PAGE_BYTES, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE_BYTES
    buffer = whole[start : start + nbytes]
    advise_huge_pages(buffer)
    return buffer


def register_with_cuda(buffer: torch.Tensor) -> bool:
    """Page-lock ``buffer``'s bytes for CUDA, so copies between it and a GPU run as DMA and need not
    wait for the host; False (logged) where CUDA refuses. Locks exactly its bytes, where
    ``pin_memory=True`` rounds an allocation up to a power of two; costs about a second per GB the
    first time (its pages are made resident)."""
    return register_address(buffer.data_ptr(), buffer.numel() * buffer.element_size())


def register_address(address: int, nbytes: int, *, read_only: bool = False) -> bool:
    """``cudaHostRegister`` of ``nbytes`` at ``address``; False (logged) where CUDA refuses."""
    flags = HOST_REGISTER_PORTABLE | (HOST_REGISTER_READ_ONLY if read_only else 0)
    error = torch.cuda.cudart().cudaHostRegister(address, nbytes, flags)  # type: ignore[no-untyped-call]
    if int(error) != 0:
        log.warning("host_register_failed", bytes=nbytes, cuda_error=int(error))
        return False
    return True


def unregister_from_cuda(address: int, *keep_alive: object) -> None:
    """Undo ``register_address`` (``keep_alive``: what must outlive the registration, held until now)."""
    torch.cuda.cudart().cudaHostUnregister(address)  # type: ignore[no-untyped-call]


def advise_huge_pages(buffer: torch.Tensor) -> bool:
    """Ask the kernel to back ``buffer``'s whole 2 MiB pages with huge pages; False where it cannot
    (said once in the log: copies then run at the base page size)."""
    start = -buffer.data_ptr() % HUGE_PAGE_BYTES
    length = (buffer.numel() * buffer.element_size() - start) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if length <= 0:
        return False
    libc, setting = _libc(), _thp_setting()
    address = ctypes.c_void_p(buffer.data_ptr() + start)
    if libc is None or "[never]" in setting or libc.madvise(address, ctypes.c_size_t(length), MADV_HUGEPAGE):
        _say_unavailable(setting)
        return False
    return True


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def _thp_setting() -> str:
    try:
        return THP_SETTING.read_text().strip()
    except OSError:
        return "unknown"


@functools.cache
def _say_unavailable(setting: str) -> None:
    log.info("kv_huge_pages_unavailable", transparent_hugepage=setting,
             effect="KV tier copies run at the base page size")  # fmt: skip
