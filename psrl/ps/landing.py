"""A prefetched version copied onto the engine's GPU in the background, so a sync copies device to device.

Why: a rollout instance stops generating for the whole of a weight load. With the bytes prefetched into
pinned host memory (``psrl.ps.prefetch``) the load was still the host-to-device copy of the whole model,
issued tensor by tensor on the engine's stream behind its decode rounds and the other processes' kernels:
0.12-0.25 s for a 0.5B model on an H100 while the instance, and the router's dispatch to every instance,
waited. Landed on the device by the prefetch thread while the engine generates, the load is a
device-to-device copy: 15-25 ms there.

How: the prefetch thread copies each tensor on a stream of its own (after the engine's queued work, so no
block a pending kernel still reads is reused) and waits for it; the landed tensors are handed over like
the host ones. The previous version's landed copy is kept until the next landing starts, so a load's copies
out of it, queued on the engine's stream, never read a reused block. A version that would not fit in a
tenth of the GPU's free memory stays on the host (``prefetch_to_device=auto``).
"""

from __future__ import annotations

from typing import Literal

import torch

LandingSetting = bool | Literal["auto"]
FREE_MEMORY_SHARE = 10  # auto: at most a tenth of the free memory for a landed copy


class DeviceLanding:
    def __init__(self, device: torch.device, setting: LandingSetting = "auto") -> None:
        if device.type != "cuda":
            raise ValueError(f"weights land on a CUDA device, not {device}")
        self.device = device
        self.setting = setting
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._landed: dict[str, torch.Tensor] | None = None
        self.num_landed = 0

    def land(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``tensors`` copied to the device (the host ones where they would not fit); blocks until they are there."""
        self._landed = None  # its blocks come back to this stream, after the wait below
        if not self._fits(tensors):
            return tensors
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            landed = {name: tensor.to(self.device, non_blocking=True) for name, tensor in tensors.items()}
        self.stream.synchronize()
        self._landed = landed
        self.num_landed += 1
        return landed

    def _fits(self, tensors: dict[str, torch.Tensor]) -> bool:
        if self.setting is True:
            return True
        num_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        free, _ = torch.cuda.mem_get_info(self.device)
        return num_bytes <= free // FREE_MEMORY_SHARE
