"""What the vLLM backend is built from: psrl's typed engine fields plus the free-form `engine.vllm_args`.

The typed fields mean the same for both backends (dtype, KV blocks, batch limits, context limit,
seed) and map onto vLLM engine arguments here, in one table (`OWNED`). `engine.vllm_args` passes
any other vLLM `EngineArgs` field through unchanged; vLLM validates it (see `validation.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from psrl.assets import DEMO_MODEL_DIR
from psrl.engine.args import EngineArgs
from psrl.engine.lora_merge import LoraServing
from psrl.engine.vllm_backend.lora import lora_engine_kwargs

if TYPE_CHECKING:
    from psrl.config import Config

# vLLM engine arguments psrl sets itself -> the psrl setting that decides them (or why it is fixed)
OWNED: dict[str, str] = {
    "model": "model.path",
    "dtype": "engine.dtype",
    "block_size": "engine.block_size",
    "num_gpu_blocks_override": "engine.num_kv_blocks",
    "max_num_seqs": "engine.max_num_seqs",
    "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "enable_prefix_caching": "engine.enable_prefix_caching",
    "max_model_len": "engine.max_model_len",
    "seed": "engine.seed",
    "enforce_eager": "engine.cuda_graphs",
    "skip_tokenizer_init": "fixed: rollout works in token ids",
    "logprobs_mode": "fixed: log-probs under the temperature-scaled distribution, as the trainer recomputes them",
    "generation_config": "fixed: sampling comes from each request, not the checkpoint's generation_config.json",
    "disable_log_stats": "fixed: instance status is read from vLLM's statistics",
}
# ... and those it sets under actor.lora (vLLM's LoRA serving; `lora.py`)
LORA_OWNED: dict[str, str] = {
    "enable_lora": "actor.lora.rank",
    "max_lora_rank": "actor.lora.rank",
    "max_loras": "fixed: one adapter version is served at a time",
    "max_cpu_loras": "fixed: the current adapter version and the one replacing it",
}


@dataclass(frozen=True)
class VllmEngineArgs:
    model_path: str | Path = DEMO_MODEL_DIR
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    device: Literal["auto", "cpu", "cuda"] = "auto"
    block_size: int = 32  # vLLM's CPU attention needs a multiple of 32
    num_kv_blocks: int = 512
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # None: the model's limit, always capped by KV capacity
    seed: int = 0
    cuda_graphs: bool = True  # False -> enforce_eager; on a CPU vLLM always runs eagerly
    initial_weight_version: int = 0
    num_threads: int = 0  # torch threads, set before vLLM starts (it pins them on CPU); 0 = leave as is
    extra: Mapping[str, Any] = field(default_factory=dict)  # engine.vllm_args
    lora: LoraServing | None = None  # actor.lora: versions are adapters, served by vLLM's LoRA support

    @classmethod
    def from_config(cls, config: Config) -> VllmEngineArgs:
        engine = config.engine
        return cls(
            model_path=config.model.path or DEMO_MODEL_DIR,
            dtype=engine.dtype,
            device=config.topology.device,
            block_size=engine.block_size,
            num_kv_blocks=engine.num_kv_blocks,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            enable_prefix_caching=engine.enable_prefix_caching,
            max_model_len=engine.max_model_len,
            seed=engine.seed,
            cuda_graphs=engine.cuda_graphs,
            num_threads=config.topology.threads_per_actor,
            extra=dict(engine.vllm_args),
            lora=_lora(config),
        )

    @property
    def is_cpu(self) -> bool:
        return self._embedded_view().resolve_device().type == "cpu"

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of vLLM's `EngineArgs`: the typed fields, then `extra` (never overlapping)."""
        view = self._embedded_view()
        dtype = view.resolve_dtype(view.resolve_device())
        typed: dict[str, Any] = {
            "model": str(self.model_path),
            "dtype": str(dtype).removeprefix("torch."),
            "block_size": self.block_size,
            "num_gpu_blocks_override": self.num_kv_blocks + 1,  # vLLM keeps one block aside (its null block)
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_prefix_caching": self.enable_prefix_caching,
            "max_model_len": self.context_limit(),
            "seed": self.seed,
            "enforce_eager": self.is_cpu or not self.cuda_graphs,
            "skip_tokenizer_init": True,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",
            "disable_log_stats": False,
        }
        if self.lora is not None:
            typed |= lora_engine_kwargs(self.lora)
        overlap = sorted(set(typed) & set(self.extra))
        if overlap:
            owners = [{**OWNED, **LORA_OWNED}[k] for k in overlap]
            raise ValueError(f"engine.vllm_args sets {overlap}, which psrl sets from {owners}")
        return typed | dict(self.extra)

    def context_limit(self) -> int:
        """As in the embedded engine: the model's limit, engine.max_model_len, and the KV capacity."""
        limits = [self.num_kv_blocks * self.block_size, _model_position_limit(Path(self.model_path))]
        limits.append(self.max_model_len)
        return min(limit for limit in limits if limit is not None)

    def _embedded_view(self) -> EngineArgs:
        # the embedded engine's device/dtype resolution, so `auto` means the same for both backends
        return EngineArgs(model_path=self.model_path, dtype=self.dtype, device=self.device)


def _lora(config: Config) -> LoraServing | None:
    lora = config.actor.lora
    return LoraServing(lora.alpha, tuple(lora.target_modules), rank=lora.rank) if lora.enabled else None


def _model_position_limit(model_dir: Path) -> int | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None  # vLLM reports an unreadable model itself
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None
