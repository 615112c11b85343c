"""torch-memory-saver as the memory backend (the ``gpu`` extra; CUDA only: it drives libcuda directly).

Two hook modes: ``torch`` (a pluggable allocator inside the process; enough for weights, optimizer
state, gradients and the KV cache) and ``preload`` (the library is preloaded into the actor process,
``LD_PRELOAD``; needed to release captured CUDA graphs, ``psrl.tms.enable_cuda_graph``). The launcher
sets ``LD_PRELOAD`` for trainer and rollout processes when the preload mode is needed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import TYPE_CHECKING, Any

from psrl.tms.memory import SideMemory
from psrl.tms.regions import managed_regions

if TYPE_CHECKING:
    from psrl.config import Config

PRELOAD_LIBRARY = "torch_memory_saver_hook_mode_preload"


class MemorySaverUnavailableError(RuntimeError):
    """torch-memory-saver cannot run here (not installed, no CUDA, or the preload library missing)."""


def hook_mode(enable_cuda_graph: bool) -> str:
    """preload when graphs are released or the process was started with the library preloaded, else torch."""
    return "preload" if enable_cuda_graph or is_preloaded() else "torch"


def preload_library() -> str:
    """Path of the library ``LD_PRELOAD`` must name for the preload hook mode."""
    from torch_memory_saver.utils import get_binary_path_from_package

    return str(get_binary_path_from_package(PRELOAD_LIBRARY))


def is_preloaded() -> bool:
    return any("torch_memory_saver" in part for part in os.environ.get("LD_PRELOAD", "").split(":"))


class TorchMemorySaverBackend:
    def __init__(self, mode: str) -> None:
        import torch

        if importlib.util.find_spec("torch_memory_saver") is None:
            raise MemorySaverUnavailableError("psrl.tms needs torch-memory-saver: pip install 'psrl[gpu]'")
        if not torch.cuda.is_available():
            raise MemorySaverUnavailableError("psrl.tms needs a CUDA device (torch-memory-saver drives libcuda)")
        if mode == "preload" and not is_preloaded():
            raise MemorySaverUnavailableError(
                "psrl.tms.enable_cuda_graph needs torch-memory-saver preloaded into the process: "
                f"LD_PRELOAD={preload_library()} (the launcher sets it for trainer and rollout actors)"
            )
        from torch_memory_saver import torch_memory_saver

        self._torch = torch
        self._saver = torch_memory_saver
        if self._saver._impl is None:  # the mode can be set once per process, before first use
            self._saver.hook_mode = mode
        # host copies are kept after a resume and reused by the next pause (no page-locking per switch)
        self._saver.retain_cpu_backup = True

    def region(self, tag: str, keeps_contents: bool) -> contextlib.AbstractContextManager[Any]:
        backup = "pinned" if keeps_contents else None  # pinned host copies: DMA at full speed both ways
        region: contextlib.AbstractContextManager[Any] = self._saver.region(
            tag=tag, enable_cpu_backup=keeps_contents, cpu_backup_backend=backup
        )
        return region

    def graph_capture(self, graph: Any, pool: Any, tag: str) -> contextlib.AbstractContextManager[Any]:
        capture: contextlib.AbstractContextManager[Any] = self._saver.cuda_graph(graph, pool=pool, tag=tag)
        return capture

    def pause(self, tag: str) -> None:
        self._saver.pause(tag)

    def resume(self, tag: str) -> None:
        self._saver.resume(tag)

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def free_bytes(self) -> int:
        return int(self._torch.cuda.mem_get_info()[0])


def side_memory(config: Config, side: str) -> SideMemory:
    """The memory of ``side`` as ``psrl.tms`` configures it (unmanaged when the range leaves it out)."""
    tms = config.psrl.tms
    regions = managed_regions(tms.range, side, enable_cuda_graph=tms.enable_cuda_graph)
    if not regions:
        return SideMemory.unmanaged(side)
    return SideMemory(side, regions, TorchMemorySaverBackend(hook_mode(tms.enable_cuda_graph)))
