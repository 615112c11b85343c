"""Regional ``torch.compile`` of the trainer's transformer layers (``actor.compile``).

Why: at the model sizes people train with RL on one GPU (0.5B-3B), a layer's matmuls are short and
the eager step spends as long again in the small kernels between them: RMSNorm in float32, rotary
embeddings, SiLU x up, residual adds, and autocast's casts of every linear's input (the residual
stream stays float32). Compiling fuses those into a few kernels per layer.

How: every transformer layer is compiled on its own (regional compilation), not the whole model: all
layers run the same code, so it is traced and built once and reused by the others; the embedding, the
LM head (the fused log-prob in psrl.trainer.logprob) and gradient checkpointing stay as they are
(a checkpointed layer recomputes through its compiled forward). Shapes are dynamic: a packed
micro-batch has a different token count every time and must not trigger a rebuild. The packed
attention is traced into the layer's graph (psrl.trainer.varlen: the flash kernel is a custom
operator), so a layer is one graph; a micro-batch of a single sequence gets a second one, since torch
specialises dimensions of size 1.

`auto` compiles on CUDA, where the gain was measured (1.33-1.35x a real-scale step at the 0.5B and
1.5B shapes, docs/benchmarks.md); on a CPU inductor needs a C++ compiler and is unmeasured here, so it
is left to `true`.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from torch import nn

CompileSetting = bool | Literal["auto"]


def compile_enabled(setting: CompileSetting, device: torch.device) -> bool:
    """The config value (`true`, `false` or `auto`) for this device."""
    if setting == "auto":
        return device.type == "cuda"
    if isinstance(setting, bool):
        return setting
    raise ValueError(f"actor.compile={setting!r}: use true, false or auto")


def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated layers of a Hugging Face model (those it can checkpoint)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def compile_layers(model: nn.Module, backend: str = "inductor") -> int:
    """Compile every transformer layer of `model` in place; returns how many.

    `backend`: inductor builds the fused kernels; tests use ``aot_eager`` to check the trace on a CPU
    in seconds."""
    # tracing a checkpointed layer, dynamo looks at .grad of the layer's input (a non-leaf tensor);
    # torch warns about that look once per trace, not about anything the step does
    warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf Tensor")
    layers = transformer_layers(model)
    for layer in layers:
        layer.compile(dynamic=True, backend=backend)
    return len(layers)
