"""How the engine captures a CUDA graph: plainly, or with its memory in a torch-memory-saver region
(``psrl.tms.enable_cuda_graph``: the graph's private memory is released while rollout is paused and
mapped back at the same addresses, so the graph replays unchanged)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

GraphCapture = Callable[[torch.cuda.CUDAGraph, Any], contextlib.AbstractContextManager[Any]]


def plain_capture(graph: torch.cuda.CUDAGraph, pool: Any) -> contextlib.AbstractContextManager[Any]:
    return torch.cuda.graph(graph, pool=pool)
