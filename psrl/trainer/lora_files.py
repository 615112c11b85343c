"""A LoRA policy's adapters on disk, in peft's file layout, and the merged export beside them.

``adapter_model.safetensors`` holds ``base_model.model.<module>.lora_A.weight`` and ``...lora_B.weight``
(peft's names for the adapters of ``<module>``); ``adapter_config.json`` their rank, alpha, dropout
and target modules. Reading them back checks names, shapes and scale against the model, so a resumed
run continues the same adapters or fails naming the setting that differs.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from psrl.checkpoint_dirs import CheckpointError, read_json
from psrl.trainer.lora import adapter_names, adapter_state, lora_modules, merged_state_dict

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
PEFT_PREFIX = "base_model.model."


def peft_name(name: str) -> str:
    return f"{PEFT_PREFIX}{name}.weight"


def own_name(name: str) -> str:
    return name.removeprefix(PEFT_PREFIX).removesuffix(".weight")


def write_adapter(model: nn.Module, state: dict[str, Tensor], directory: Path) -> dict[str, Tensor]:
    """Write ``state``'s adapters to ``directory``; returns the merged state dict (for the HF export)."""
    directory.mkdir(parents=True)
    adapters = {peft_name(n): t.detach().cpu().contiguous() for n, t in adapter_state(state).items()}
    save_file(adapters, str(directory / ADAPTER_FILE))
    (directory / CONFIG_FILE).write_text(json.dumps(adapter_config(model), indent=1))
    return merged_state_dict(model, state)


def adapter_config(model: nn.Module) -> dict[str, object]:
    modules = dict(lora_modules(model))
    first = next(iter(modules.values()))
    rank = int(first.lora_A.shape[0])
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(getattr(getattr(model, "config", None), "_name_or_path", "")),
        "r": rank,
        "lora_alpha": first.alpha,
        "lora_dropout": first.dropout,
        "target_modules": sorted({name.rpartition(".")[2] for name in modules}),
        "bias": "none",
    }


def read_adapter(model: nn.Module, directory: Path) -> dict[str, Tensor]:
    """The adapters saved in ``directory`` under the model's own names; CheckpointError when they do not fit."""
    saved = read_json(directory / CONFIG_FILE)
    expected = adapter_config(model)
    for key, setting in (("r", "rank"), ("lora_alpha", "alpha"), ("target_modules", "target_modules")):
        if saved.get(key) != expected[key]:
            raise CheckpointError(
                f"{directory}: adapters of {key}={saved.get(key)!r}, the trainer's actor.lora.{setting} gives "
                f"{expected[key]!r}; fix: set actor.lora.{setting} as in the run that wrote the checkpoint"
            )
    tensors = {own_name(n): t for n, t in load_file(str(directory / ADAPTER_FILE)).items()}
    names = set(adapter_names(model))
    if set(tensors) != names:
        raise CheckpointError(
            f"{directory}: adapter names differ from the model's (e.g. {sorted(set(tensors) ^ names)[:3]})"
        )
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if n in names}
    wrong = [n for n, t in tensors.items() if tuple(t.shape) != shapes[n]]
    if wrong:
        raise CheckpointError(f"{directory}: adapter shapes differ from the model's ({wrong[:3]})")
    return tensors
