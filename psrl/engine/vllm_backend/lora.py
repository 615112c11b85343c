"""LoRA versions for the vLLM backend: each pulled adapter version becomes a peft adapter that vLLM serves.

Under ``actor.lora`` a version is the adapters only (``<module>.lora_A`` / ``.lora_B``, see
`psrl.models.lora`); vLLM keeps the base weights it loaded at start and applies adapters itself
(``enable_lora``, its punica kernels). vLLM takes adapters from a directory in peft's layout, the one
`psrl.trainer.lora_files` writes: ``adapter_model.safetensors`` with ``base_model.model.<module>.lora_A.weight``
names and ``adapter_config.json``. Each version is written to a directory of its own and handed to vLLM
as a `LoRARequest` with a fresh id; requests generate under the current version's request.

vLLM reads the files once, into its own adapter cache (which holds the current version and, during a
switch, the previous one, so it never reads them again): a version's directory is removed as soon as
vLLM has loaded it, and nothing is left on disk by a process that exits without teardown.

The latest adapters are held, as in the embedded engine's merge, so a delta-synced version that carries
only the tensors that changed is written whole; every tensor is checked against the checkpoint's
projection shapes and the configured rank before anything is written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from psrl.engine.lora_merge import LoraServing
from psrl.models.lora import LORA_A, LORA_B, AdapterError, base_weight_name, check_adapter_shapes, split_adapter_name

ADAPTER_FILE = "adapter_model.safetensors"  # peft's names, as psrl.trainer.lora_files writes them
CONFIG_FILE = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
SCRATCH = Path("/dev/shm")  # adapter files are rewritten every version: memory-backed where there is one


def vllm_lora_ranks() -> tuple[int, ...]:
    """The values vLLM accepts for max_lora_rank (empty when this vLLM has no LoRA support)."""
    try:
        from vllm.config.lora import MaxLoRARanks
    except ImportError:
        return ()
    return tuple(int(rank) for rank in typing.get_args(MaxLoRARanks))


def max_lora_rank(rank: int, allowed: tuple[int, ...]) -> int | None:
    """The smallest max_lora_rank vLLM accepts that holds ``rank`` (None: none does)."""
    fitting = [value for value in allowed if value >= rank]
    return min(fitting) if fitting else None


def lora_engine_kwargs(lora: LoraServing) -> dict[str, Any]:
    """vLLM engine arguments that turn its LoRA serving on for adapters of ``lora.rank``."""
    ranks = vllm_lora_ranks()
    if not ranks:
        raise AdapterError(
            "actor.lora with engine.backend=vllm: this vLLM has no LoRA support (vllm.config.lora); "
            "fix: install the vllm extra, or set engine.backend=embedded"
        )
    fitting = max_lora_rank(lora.rank, ranks)
    if fitting is None:
        raise AdapterError(
            f"actor.lora.rank={lora.rank}: vLLM serves LoRA ranks up to {max(ranks)}; fix: set "
            f"actor.lora.rank <= {max(ranks)}, or engine.backend=embedded"
        )
    # one adapter is active at a time: a version switch moves every running request onto the new one
    return {"enable_lora": True, "max_lora_rank": fitting, "max_loras": 1, "max_cpu_loras": 2}


@dataclass
class VllmAdapters:
    """The held adapters and the directories of the versions written for vLLM."""

    lora: LoraServing
    base_shapes: dict[str, tuple[int, ...]]  # checkpoint tensor -> shape
    root: Path | None = None  # where version directories go (None: /dev/shm where there is one, else the temp dir)
    adapters: dict[str, Tensor] = field(default_factory=dict)  # adapter tensor name -> tensor
    next_id: int = 1

    def write_version(self, named: list[tuple[str, Tensor]], version: int) -> tuple[Path, int, dict[str, Tensor]]:
        """Check ``named`` (adapters only), write the whole version; returns (directory, lora id, new held set).

        AdapterError (nothing written) for a tensor that is not an adapter of a targeted projection,
        a wrong shape or rank, or a pair whose other half was never loaded."""
        held = dict(self.adapters)
        for name, tensor in named:
            self._check(name, tensor)
            held[name] = tensor.detach().to("cpu", copy=True)
        self._check_pairs(held)
        lora_id, self.next_id = self.next_id, self.next_id + 1
        directory = Path(tempfile.mkdtemp(prefix=f"psrl-lora-v{version}-", dir=self.root or _scratch_dir()))
        tensors = {f"{PEFT_PREFIX}{name}.weight": tensor.contiguous() for name, tensor in held.items()}
        save_file(tensors, str(directory / ADAPTER_FILE))
        (directory / CONFIG_FILE).write_text(json.dumps(self._peft_config(), indent=1))
        return directory, lora_id, held

    def _check(self, name: str, tensor: Tensor) -> None:
        parts = split_adapter_name(name)
        if parts is None:
            raise AdapterError(
                f"{name}: under actor.lora the vLLM backend serves adapter versions (lora_A / lora_B tensors) "
                "over the base weights it started with; base weights are never reloaded"
            )
        module, kind = parts
        base = self.base_shapes.get(base_weight_name(module))
        if base is None or module.rpartition(".")[2] not in self.lora.target_modules:
            raise AdapterError(
                f"{name}: no targeted projection {module} in this engine (engine targets "
                f"{list(self.lora.target_modules)}; the trainer's actor.lora.target_modules must be the same)"
            )
        rank = self.lora.rank
        expected = (rank, base[1]) if kind == LORA_A else (base[0], rank)
        if tuple(tensor.shape) != expected:
            raise AdapterError(
                f"{name}: shape {tuple(tensor.shape)}, expected {expected} (the vLLM backend serves rank "
                f"actor.lora.rank={rank}; the trainer's must be the same)"
            )

    def _check_pairs(self, held: dict[str, Tensor]) -> None:
        for name, tensor in held.items():
            module, kind = split_adapter_name(name) or ("", "")
            other = f"{module}.{LORA_B if kind == LORA_A else LORA_A}"
            if other not in held:
                raise AdapterError(f"{other} was never loaded: a version's first load must carry both halves")
            lora_a, lora_b = (tensor, held[other]) if kind == LORA_A else (held[other], tensor)
            base = torch.Size(self.base_shapes[base_weight_name(module)])
            check_adapter_shapes(module, base, lora_a.shape, lora_b.shape)

    def _peft_config(self) -> dict[str, object]:
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.lora.rank,
            "lora_alpha": self.lora.alpha,
            "lora_dropout": 0.0,
            "target_modules": list(self.lora.target_modules),
            "bias": "none",
        }

    def commit(self, held: dict[str, Tensor]) -> None:
        self.adapters = held

    def discard(self, directory: Path) -> None:
        shutil.rmtree(directory, ignore_errors=True)


def _scratch_dir() -> str | None:
    return str(SCRATCH) if SCRATCH.is_dir() else None
