"""Gradient checkpointing by a memory budget: recompute a micro-batch's layers only when its
activations would not fit.

`actor.gradient_checkpointing` is ``auto`` (the default), ``true`` or ``false``. Under ``auto`` the
decision is made per micro-batch of the update: the activations a forward keeps for its backward
are estimated from the model's shape and the micro-batch's tokens,

    tokens x layers x ((10 x hidden + 4 x intermediate) x bytes of the compute dtype + 8 x hidden)

(the inputs of the norms, projections, attention and MLP a decoder layer saves, and the float32
norm statistics). When that exceeds `BUDGET_SHARE` of the memory still free on the device (on CUDA:
free memory plus what the caching allocator holds unused; on a CPU: the host's available memory,
MemAvailable), the fewest layers are recomputed that bring it under (a recomputed layer keeps only
its input, `hidden` values a token): recomputation costs a layer's forward again, so recomputing
every layer where a few suffice gives away up to a quarter of the step. No-grad forwards never
checkpoint (nothing is kept for a backward). Fixed ``true`` / ``false`` recompute every layer or
none, for benchmarks that compare both.
"""

from __future__ import annotations

import contextlib
import math
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
    bytes_per_token: float = 0.0  # every layer's activations, none recomputed
    kept_bytes_per_token: float = 0.0  # what a recomputed layer keeps (its input)
    checkpointed: int = 0  # micro-batches that recomputed layers, since the model was loaded
    micro_batches: int = 0  # micro-batches the rule decided on
    layers_recomputed: int = 0  # layers recomputed, summed over those micro-batches

    def __post_init__(self) -> None:
        if self.mode == "off":
            return
        enable_gradient_checkpointing(self.model)
        self.layers = [m for m in self.model.modules() if hasattr(m, "_gradient_checkpointing_func")]
        self.bytes_per_token = activation_bytes_per_token(self.model, self.compute_dtype)
        self.kept_bytes_per_token = _hidden_size(self.model) * torch.empty(0, dtype=self.compute_dtype).element_size()
        self._set(self.mode == "on")

    def _set(self, enabled: bool, count: int | None = None) -> None:
        """Recompute the first `count` layers (all of them when None) if `enabled`, none otherwise."""
        count = len(self.layers) if count is None or not enabled else count
        for index, layer in enumerate(self.layers):
            setattr(layer, "gradient_checkpointing", enabled and index < count)  # noqa: B010 - transformers' flag, not a module attribute mypy knows

    def layers_to_recompute(self, num_tokens: int, device: torch.device) -> int:
        if self.mode != "auto":
            return len(self.layers) if self.mode == "on" else 0
        return layers_to_recompute(
            num_tokens * self.bytes_per_token,
            num_tokens * self.kept_bytes_per_token,
            len(self.layers),
            BUDGET_SHARE * free_bytes(device),
        )

    @contextlib.contextmanager
    def around(self, num_tokens: int, device: torch.device) -> Iterator[None]:
        """Recompute as many layers as the rule says during one forward+backward of `num_tokens` tokens."""
        count = self.layers_to_recompute(num_tokens, device)
        self.micro_batches += 1
        self.checkpointed += count > 0
        self.layers_recomputed += count
        self._set(count > 0, count)
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


def layers_to_recompute(activations: float, kept_per_layer: float, num_layers: int, budget: float) -> int:
    """The fewest of `num_layers` layers to recompute so that a forward's kept activations fit `budget`:
    every layer keeps `activations / num_layers`, a recomputed one `kept_per_layer` (all of them
    when even that does not fit)."""
    if activations <= budget or num_layers == 0:
        return 0
    per_layer = activations / num_layers
    saved = per_layer - kept_per_layer
    if saved <= 0:
        return num_layers
    return min(num_layers, math.ceil((activations - budget) / saved))


def _model_config(model: nn.Module) -> object:
    """The model's Hugging Face config (a critic keeps it on its backbone)."""
    return getattr(model, "config", None) or getattr(getattr(model, "backbone", None), "config", None)


def _hidden_size(model: nn.Module) -> int:
    return int(getattr(_model_config(model), "hidden_size", 0))


def activation_bytes_per_token(model: nn.Module, compute_dtype: torch.dtype) -> float:
    """Activation bytes one token keeps for the backward over every layer (the estimate above)."""
    config = _model_config(model)
    hidden = _hidden_size(model)
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
