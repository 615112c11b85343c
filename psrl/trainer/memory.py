"""Gradient checkpointing by a memory budget: recompute a micro-batch's layers only when its
activations would not fit.

`actor.gradient_checkpointing` is ``auto`` (the default), ``true`` or ``false``. Under ``auto`` the
decision is made per micro-batch of the update: the activations a forward keeps for its backward
are estimated from the model's shape and the micro-batch's tokens,

    tokens x layers x ((10 x hidden + 4 x intermediate) x bytes of the compute dtype + 8 x hidden)

(the inputs of the norms, projections, attention and MLP a decoder layer saves, and the float32
norm statistics), and the layers are checkpointed when that exceeds `BUDGET_SHARE` of the memory
still free on the device (on CUDA: free memory plus what the caching allocator holds unused; on a
CPU: the host's available memory, MemAvailable). No-grad forwards never checkpoint (nothing is kept for a
backward). Fixed ``true`` / ``false`` keep the old behaviour for benchmarks that compare both.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from psrl.trainer.models import enable_gradient_checkpointing

CheckpointMode = Literal["auto", "on", "off"]
BUDGET_SHARE = 0.6  # of the free memory: headroom for the LM-head chunks, gradients and the allocator's slack


def checkpoint_mode(value: bool | str) -> CheckpointMode:
    """The config value (`true`, `false` or `auto`) as a mode."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value == "auto":
        return "auto"
    raise ValueError(f"actor.gradient_checkpointing={value!r}: use true, false or auto")


@dataclass
class CheckpointPolicy:
    """Which micro-batches of one model's updates recompute their layers."""

    model: nn.Module
    mode: CheckpointMode
    compute_dtype: torch.dtype
    layers: list[nn.Module] = field(default_factory=list)
    bytes_per_token: float = 0.0
    checkpointed: int = 0  # micro-batches that recomputed their layers, since the model was loaded
    micro_batches: int = 0  # micro-batches the rule decided on

    def __post_init__(self) -> None:
        if self.mode == "off":
            return
        enable_gradient_checkpointing(self.model)
        self.layers = [m for m in self.model.modules() if hasattr(m, "_gradient_checkpointing_func")]
        self.bytes_per_token = activation_bytes_per_token(self.model, self.compute_dtype)
        self._set(self.mode == "on")

    def _set(self, enabled: bool) -> None:
        for layer in self.layers:
            setattr(layer, "gradient_checkpointing", enabled)  # noqa: B010 - transformers' flag, not a module attribute mypy knows

    def wants(self, num_tokens: int, device: torch.device) -> bool:
        if self.mode != "auto":
            return self.mode == "on"
        return num_tokens * self.bytes_per_token > BUDGET_SHARE * free_bytes(device)

    @contextlib.contextmanager
    def around(self, num_tokens: int, device: torch.device) -> Iterator[None]:
        """Checkpoint the layers during one forward+backward of `num_tokens` tokens if the rule says so."""
        enabled = self.wants(num_tokens, device)
        self.micro_batches += 1
        self.checkpointed += enabled
        self._set(enabled)
        try:
            yield
        finally:
            self._set(self.mode == "on")

    @contextlib.contextmanager
    def no_grad_forwards(self) -> Iterator[None]:
        """No checkpointing in forwards that keep nothing for a backward."""
        self._set(False)
        try:
            yield
        finally:
            self._set(self.mode == "on")


def activation_bytes_per_token(model: nn.Module, compute_dtype: torch.dtype) -> float:
    """Activation bytes one token keeps for the backward over every layer (the estimate above)."""
    config = getattr(model, "config", None) or getattr(getattr(model, "backbone", None), "config", None)
    hidden = int(getattr(config, "hidden_size", 0))
    intermediate = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
    layers = int(getattr(config, "num_hidden_layers", 1))
    size = torch.empty(0, dtype=compute_dtype).element_size()
    return float(layers * ((10 * hidden + 4 * intermediate) * size + 8 * hidden))


def free_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return float(free + cached)
    return _host_available_bytes()


def _host_available_bytes() -> float:
    """The kernel's estimate of memory available without swapping (MemAvailable: free plus reclaimable cache)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):  # pragma: no cover - a platform without either
        return float("inf")
