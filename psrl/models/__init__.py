"""Model code of the embedded engine: Llama / Qwen2-family decoders loaded from HF checkpoints."""

from psrl.models.llama import DecoderModel
from psrl.models.loader import build_model, expected_weight_names, iter_safetensors
from psrl.models.spec import ModelSpec, RopeSpec, UnsupportedModelError
from psrl.models.weights import WeightLoadError

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
