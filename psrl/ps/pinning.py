"""Page-locking host memory that already exists (``cudaHostRegister``), so CUDA copies from it run as DMA.

``torch.empty(..., pin_memory=True)`` rounds every allocation up to a power of two (its caching host
allocator), which for a 7B model's weights costs gigabytes of locked memory; registering buffers the
puller already holds (its mirror, the shards' mapped files) locks exactly their bytes. Registration
costs about a second per GB once per buffer; buffers are kept across pulls, so it is paid once.
"""

from __future__ import annotations

import numpy as np

from psrl.kvcache.host_buffer import register_address, unregister_from_cuda


def register(view: memoryview, *, read_only: bool = False) -> int | None:
    """Lock ``view``'s pages; its address (for ``unregister``), or None when CUDA refused (logged)."""
    address = int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
    return address if register_address(address, len(view), read_only=read_only) else None


def unregister(address: int) -> None:
    unregister_from_cuda(address)
