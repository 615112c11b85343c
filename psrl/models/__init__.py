"""Model code of the embedded engine: Llama / Qwen2-family decoders loaded from HF checkpoints."""

from psrl.models.llama import DecoderModel, WeightLoadError
from psrl.models.loader import build_model, expected_weight_names, iter_safetensors
from psrl.models.spec import ModelSpec, RopeSpec, UnsupportedModelError

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
