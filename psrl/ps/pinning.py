"""Page-locking host memory that already exists (``cudaHostRegister``), so CUDA copies from it run as DMA.

``torch.empty(..., pin_memory=True)`` rounds every allocation up to a power of two (its caching host
allocator), which for a 7B model's weights costs gigabytes of locked memory; registering buffers the
puller already holds (its mirror, the shards' mapped files) locks exactly their bytes. Registration
costs about a second per GB once per buffer; buffers are kept across pulls, so it is paid once.
"""

from __future__ import annotations

import numpy as np

from psrl.log import get_logger

# cudaHostRegister flags: portable to every context; read-only for mappings opened without write access
# (pinning a copy-on-write mapping would otherwise copy its pages).
HOST_REGISTER_PORTABLE, HOST_REGISTER_READ_ONLY = 0x01, 0x08


def register(view: memoryview, *, read_only: bool = False) -> int | None:
    """Lock ``view``'s pages; its address (for ``unregister``), or None when CUDA refused (logged)."""
    import torch

    address = int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
    flags = HOST_REGISTER_PORTABLE | (HOST_REGISTER_READ_ONLY if read_only else 0)
    error = torch.cuda.cudart().cudaHostRegister(address, len(view), flags)  # type: ignore[no-untyped-call]
    if int(error) != 0:
        get_logger("psrl.ps.pinning").warning("ps.pin_failed", bytes=len(view), cuda_error=int(error))
        return None
    return address


def unregister(address: int) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(address)  # type: ignore[no-untyped-call]
