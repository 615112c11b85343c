"""What the engine needs to know about a checkpoint, read from its Hugging Face `config.json`.

Both config layouts are accepted: transformers >= 5 writes `rope_parameters` (with `rope_theta`
inside), older checkpoints write `rope_theta` plus an optional `rope_scaling` dict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psrl.errors import FatalError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")  # Llama 1-3.x, Qwen2 / 2.5, Qwen3 dense
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class UnsupportedModelError(FatalError):
    """The checkpoint uses an architecture or option the embedded engine does not implement."""


@dataclass(frozen=True, slots=True)
class RopeSpec:
    rope_type: str
    theta: float
    # type-specific parameters (factor, low_freq_factor, beta_fast, ...), as written in the config
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeSpec
    has_qkv_bias: bool
    has_o_bias: bool  # Llama's attention_bias covers o_proj too; Qwen2's qkv bias does not
    has_mlp_bias: bool
    has_qk_norm: bool  # Qwen3: an RMSNorm over each query and key head before the rotary embedding
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelSpec:
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise FatalError(f"{path} is not a Hugging Face checkpoint directory: {config_path} is missing")
        config = json.loads(config_path.read_text())
        generation_path = Path(path) / "generation_config.json"
        generation = json.loads(generation_path.read_text()) if generation_path.is_file() else {}
        return cls.from_hf_config(config, generation)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelSpec:
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported; "
                f"the embedded engine runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        _check_unsupported_options(config)
        num_heads = int(config["num_attention_heads"])
        hidden_size = int(config["hidden_size"])
        return cls(
            model_type=model_type,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or hidden_size // num_heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            rope=_read_rope(config),
            has_qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),  # qwen2: always
            has_o_bias=model_type in ("llama", "qwen3") and bool(config.get("attention_bias", False)),
            has_mlp_bias=bool(config.get("mlp_bias", False)),
            has_qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            eos_token_ids=_read_eos(config, generation or {}),
        )


def _check_unsupported_options(config: dict[str, Any]) -> None:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {config['hidden_act']!r} is not supported (only silu)")
    if config.get("use_sliding_window"):
        raise UnsupportedModelError("sliding-window attention is not supported")
    if config.get("pretraining_tp", 1) not in (1, None):
        raise UnsupportedModelError("pretraining_tp > 1 is not supported")


def _read_rope(config: dict[str, Any]) -> RopeSpec:
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    theta = float(params.pop("rope_theta", None) or config.get("rope_theta") or 10000.0)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported; use one of {SUPPORTED_ROPE_TYPES}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError("partial rotary embeddings are not supported")
    if rope_type in ("llama3", "yarn") and "original_max_position_embeddings" not in params:
        params["original_max_position_embeddings"] = config.get(
            "original_max_position_embeddings", config.get("max_position_embeddings", 2048)
        )
    return RopeSpec(rope_type=rope_type, theta=theta, params=params)


def _read_eos(config: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    eos: set[int] = set()
    for source in (config.get("eos_token_id"), generation.get("eos_token_id")):
        if isinstance(source, int):
            eos.add(source)
        elif isinstance(source, list):
            eos.update(int(token) for token in source)
    return tuple(sorted(eos))
