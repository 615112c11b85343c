"""Model code of the embedded engine: Llama / Qwen2-family decoders loaded from HF checkpoints.

`ModelSpec` (a checkpoint's shape, read from its config.json) imports nothing heavy, so the launcher's
checks read it without torch; the model code and the loader are imported when first named.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from psrl.models.spec import ModelSpec, RopeSpec, UnsupportedModelError

if TYPE_CHECKING:
    from psrl.models.llama import DecoderModel
    from psrl.models.loader import build_model, expected_weight_names, iter_safetensors
    from psrl.models.weights import WeightLoadError

_TORCH_BACKED = {
    "DecoderModel": "psrl.models.llama",
    "build_model": "psrl.models.loader",
    "expected_weight_names": "psrl.models.loader",
    "iter_safetensors": "psrl.models.loader",
    "WeightLoadError": "psrl.models.weights",
}


def __getattr__(name: str) -> Any:
    module = _TORCH_BACKED.get(name)
    if module is None:
        raise AttributeError(f"module 'psrl.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DecoderModel",
    "ModelSpec",
    "RopeSpec",
    "UnsupportedModelError",
    "WeightLoadError",
    "build_model",
    "expected_weight_names",
    "iter_safetensors",
]
