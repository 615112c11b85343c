"""The checks a weight update passes before vLLM reloads it in place.

vLLM reloads weights layer by layer through its own `reload_weights` (which redoes per-layer
processing such as the CPU build's packed GEMM weights). A layer whose tensors arrive only in
part would be rebuilt with the missing part uninitialised, so an update must carry every tensor
of the checkpoint; names and shapes are checked against the checkpoint's safetensors headers
first, and a bad update changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from psrl.models import WeightLoadError

TIED_HEAD = "lm_head.weight"  # tied checkpoints omit it; trainers may still send it
EMBEDDING = "model.embed_tokens.weight"


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the checkpoint with its shape, read from the safetensors headers."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    if not shapes:
        raise WeightLoadError(f"no safetensors weights in {model_dir}")
    return shapes


def checked_update(
    named: list[tuple[str, torch.Tensor]], expected: dict[str, tuple[int, ...]]
) -> list[tuple[str, torch.Tensor]]:
    """The tensors to reload; raises WeightLoadError unless `named` covers the checkpoint, with its shapes.

    A tied checkpoint's head is sent as a copy of the new embedding: vLLM's CPU build computes
    logits from a packed copy of the head, which it rebuilds only for a layer that receives weights.
    """
    to_load: dict[str, torch.Tensor] = {}
    for name, tensor in named:
        want = expected.get(name)
        if want is None and name == TIED_HEAD:
            continue  # replaced by the embedding below
        if want is None:
            raise WeightLoadError(f"{name} is not a tensor of this checkpoint")
        if tuple(tensor.shape) != want:
            raise WeightLoadError(f"{name} has shape {tuple(tensor.shape)}, the checkpoint's is {want}")
        to_load[name] = tensor
    missing = sorted(set(expected) - set(to_load))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise WeightLoadError(
            f"the vLLM backend reloads whole layers, so an update must carry every tensor; missing {shown}"
        )
    if TIED_HEAD not in expected and EMBEDDING in to_load:
        to_load[TIED_HEAD] = to_load[EMBEDDING]
    return list(to_load.items())
