"""Engine construction arguments, and their derivation from the run configuration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from psrl.assets import DEMO_MODEL_DIR
from psrl.engine.lora_merge import LoraServing

if TYPE_CHECKING:
    from psrl.config import Config


@dataclass(frozen=True, slots=True)
class EngineArgs:
    model_path: str | Path = DEMO_MODEL_DIR
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    block_size: int = 16
    num_kv_blocks: int = 512
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    # context limit; None = the model's max_position_embeddings (always capped by KV capacity)
    max_model_len: int | None = None
    seed: int = 0
    initial_weight_version: int = 0
    # replay decode steps as CUDA graphs (CUDA only)
    cuda_graphs: bool = True
    # run decode at the graphs' padded bucket shapes even without graphs (how CPU tests cover that path)
    bucketed_decode: bool = False
    # eager decode reads keys/values from a dense per-sequence copy instead of gathering blocks each step
    # (faster on CPU; costs a second copy of the running sequences' KV)
    dense_decode: bool = True
    # fused fp32 CPU decode kernels, compiled with the system C compiler on first use: "auto" uses them
    # where they apply and can be built (and logs a warning when they cannot), "on" makes that an error
    cpu_kernels: Literal["auto", "on", "off"] = "auto"
    # GPU step kernels (psrl.kernels.gpu, Triton) for prefill and decode rounds: "auto" uses them on CUDA when
    # Triton imports (and warns and keeps the torch path when not), "on" makes that an error, "off" keeps the
    # torch path; "torch" runs the same rounds with the torch reference kernels (how CPU tests cover them)
    gpu_kernels: Literal["auto", "on", "off", "torch"] = "auto"
    # decode steps per scheduling round with the step kernels (sampled on the device; stop tokens truncated after)
    decode_steps: int = 16
    # capture the decode rounds' graphs of every batch size when the engine starts (else each on first use)
    capture_graphs_at_start: bool = False
    # capture a missing round's graph whenever the engine has nothing to run (see Engine.capture_when_idle)
    capture_graphs_when_idle: bool = False
    # offload tier (psrl.lmcache): bytes of CPU memory for evicted prefix blocks (0 = no tier), its eviction
    # order, and whether a weight load empties it (else entries are told apart by their version tag)
    offload_bytes: int = 0
    offload_policy: Literal["LRU", "FIFO"] = "LRU"
    offload_clear_on_update: bool = False
    offload_pin_budget: int = 0  # most tier blocks pinned for pin_sync transfers at once (0 = no limit)
    offload_store: Literal["lmcache", "host"] = "lmcache"  # where the tier's bytes live (psrl.kvcache)
    # LoRA (actor.lora): versions are adapters, merged on load into these projections' base weights or applied
    # unmerged next to them (engine.lora_mode); None = off
    lora: LoraServing | None = None

    @classmethod
    def from_config(cls, config: Config) -> EngineArgs:
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
            cpu_kernels=engine.cpu_kernels,
            gpu_kernels=engine.gpu_kernels,
            decode_steps=engine.decode_steps,
            capture_graphs_at_start=engine.capture_graphs_at_start,
            capture_graphs_when_idle=engine.capture_graphs_when_idle is not False,
            offload_bytes=_offload_bytes(config),
            offload_policy=config.psrl.lmcache.cache_policy,
            offload_clear_on_update=config.psrl.lmcache.clear_on_weight_update,
            offload_pin_budget=config.psrl.lmcache.gpu_pin_block_budget,
            offload_store=config.psrl.lmcache.store,
            lora=_lora(config),
        )

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return torch.bfloat16 if self.dtype == "bfloat16" else torch.float32


def _offload_bytes(config: Config) -> int:
    """Each instance's share of psrl.lmcache.offload_size_gb (0 = no tier)."""
    lm = config.psrl.lmcache
    if not lm.enable:
        return 0
    return int(lm.offload_size_gb / max(1, config.topology.n_rollout_instances) * 1024**3)


def _lora(config: Config) -> LoraServing | None:
    lora = config.actor.lora
    if not lora.enabled:
        return None
    return LoraServing(lora.alpha, tuple(lora.target_modules), rank=lora.rank, mode=config.engine.lora_mode)
