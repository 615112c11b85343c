"""Trainer checkpoints: everything needed to resume with the same version numbering, and no pickle.

Layout of `<root>/step_<version:08d>/` (written under a `.tmp` name and renamed when complete, so
a directory with the final name is always whole):

    policy/                     Hugging Face layout (config.json + safetensors): loadable by the engine
    policy_optimizer.safetensors + policy_optimizer.json    AdamW state by parameter name
    critic/ + critic_optimizer.*                            only with a critic
    rng.safetensors             torch CPU (and CUDA) generator states
    trainer_state.json          version, next prompt id, Python `random` state, format number
    policy/ also holds the tokenizer (with its chat template) and generation config, so
    `transformers` (and any engine) loads it as it is.
    policy_adapter/             only under LoRA (actor.lora): the adapters, in peft's file layout
                                (adapter_model.safetensors + adapter_config.json); policy/ is then
                                the merged model (base + adapters), and resuming reads the adapters
                                only (the base comes from model.path, as at the start)

Under data parallelism the full (unsharded) state is gathered to rank 0, which writes; on resume
every rank reads the files (one host, or a shared filesystem across hosts).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from psrl.checkpoint_dirs import (
    STEP_PREFIX,
    CheckpointError,
    complete_dirs,
    latest_checkpoint,
    read_json,
    read_trainer_state,
    version_of,
)
from psrl.trainer import lora_files
from psrl.trainer.host_copy import PinnedStager
from psrl.trainer.lora import has_lora
from psrl.trainer.parallel import ParallelContext

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions


def _state_dict_api() -> Any:
    """torch's distributed state-dict API, imported when a checkpoint is saved or loaded: it pulls in
    DTensor and much of torch.distributed (about 0.7 CPU-seconds), which a trainer rank needs only then."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


FORMAT = 1
KEY_SEPARATOR = "::"


@dataclass
class Trainable:
    """A model (possibly wrapped for data parallelism), its unwrapped Hugging Face-style module and optimizer."""

    name: str  # "policy" or "critic"
    model: nn.Module
    raw: nn.Module
    optimizer: torch.optim.Optimizer


def step_dir(root: Path, version: int) -> Path:
    return root / f"{STEP_PREFIX}{version:08d}"


@dataclass
class CheckpointSnapshot:
    """A checkpoint's contents taken off the live trainer (host copies, RNG states): writing it to disk
    may overlap the training that follows."""

    version: int
    next_prompt_id: int
    states: list[tuple[Trainable, dict[str, Tensor], dict[str, Any]]]
    rng: dict[str, Tensor]
    python_random: tuple[Any, ...]
    # taken on the device (`on_device`): recorded after its copies there; the writer moves them to the host
    ready: torch.cuda.Event | None = None


def snapshot_checkpoint(
    version: int, trainables: list[Trainable], parallel: ParallelContext, *, next_prompt_id: int = 0,
    own_copies: bool = False, on_device: bool = False,
) -> CheckpointSnapshot:  # fmt: skip
    """The full state of `version` on the host; collective under data parallelism (every rank must call).
    `own_copies`: copy tensors that the host state shares with the live model (a CPU trainer's), so that
    the snapshot stays that of `version` while training goes on. `on_device`: copy the state on its GPU
    instead (milliseconds, where a copy to pageable host memory takes seconds and holds the step); the
    writer moves it to the host (``on_host``)."""
    options = _state_dict_api().StateDictOptions(full_state_dict=True, cpu_offload=not on_device)
    states = [(t, _model_state(t, options), _optimizer_state(t, options)) for t in trainables]
    if own_copies or on_device:
        memo: dict[tuple[int, int, torch.Size, torch.dtype], Tensor] = {}
        states = [(t, _owned(model, memo), _owned(optimizer, memo)) for t, model, optimizer in states]
    ready = None
    if on_device:
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
    return CheckpointSnapshot(version, next_prompt_id, states, _rng_states(), random.getstate(), ready)


def on_host(snapshot: CheckpointSnapshot) -> CheckpointSnapshot:
    """A snapshot taken on the device, copied to host memory through pinned slots on a stream of its own
    (the training that goes on meanwhile keeps the default one); a host snapshot as it is."""
    if snapshot.ready is None:
        return snapshot
    stager = PinnedStager(next(snapshot.states[0][0].raw.parameters()).device)
    stager.stream.wait_event(snapshot.ready)
    memo: dict[tuple[int, int, torch.Size, torch.dtype], Tensor] = {}
    states = [
        (t, _moved(model, memo, stager), _moved(optimizer, memo, stager)) for t, model, optimizer in snapshot.states
    ]
    return dataclasses.replace(snapshot, states=states, ready=None)


def snapshot_bytes(trainables: list[Trainable]) -> int:
    """Bytes of the parameters and optimizer state a snapshot of these trainables copies."""
    total = 0
    for trainable in trainables:
        total += sum(p.numel() * p.element_size() for p in trainable.model.parameters())
        for entries in trainable.optimizer.state.values():
            total += sum(v.numel() * v.element_size() for v in entries.values() if isinstance(v, Tensor))
    return total


def _owned(value: Any, memo: dict[tuple[int, int, torch.Size, torch.dtype], Tensor]) -> Any:
    """`value` with every tensor copied; tensors that alias each other (tied weights) stay one copy."""
    return _mapped(value, memo, lambda tensor: tensor.detach().clone())


def _moved(value: Any, memo: dict[tuple[int, int, torch.Size, torch.dtype], Tensor], stager: PinnedStager) -> Any:
    """`value` with every tensor copied to host memory; aliases stay one copy."""
    return _mapped(value, memo, stager.to_host)


def _mapped(
    value: Any, memo: dict[tuple[int, int, torch.Size, torch.dtype], Tensor], copy: Callable[[Tensor], Tensor]
) -> Any:
    if isinstance(value, Tensor):
        key = (value.untyped_storage().data_ptr(), int(value.storage_offset()), value.shape, value.dtype)
        if key not in memo:
            memo[key] = copy(value)
        return memo[key]
    if isinstance(value, dict):
        return {k: _mapped(v, memo, copy) for k, v in value.items()}
    if isinstance(value, list):
        return [_mapped(v, memo, copy) for v in value]
    return value


def write_checkpoint(
    root: str | Path, snapshot: CheckpointSnapshot, *, assets_dir: str | Path | None = None, keep: int = 0
) -> Path:
    """Write a snapshot under `root` (rank 0's part of a save): staged under a `.tmp` name and renamed
    when whole; then only the `keep` newest checkpoints are kept (0 = all)."""
    snapshot = on_host(snapshot)
    final = step_dir(Path(root), snapshot.version)
    staging = final.with_suffix(".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for trainable, model_state, optimizer_state in snapshot.states:
        _write_model(trainable, model_state, staging / trainable.name)
        _write_optimizer(optimizer_state, staging / f"{trainable.name}_optimizer")
    if assets_dir is not None:
        copy_model_assets(Path(assets_dir), staging / "policy")
    _write_trainer_state(staging, snapshot)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    if keep > 0:
        prune_checkpoints(Path(root), keep)
    return final


def save_checkpoint(
    root: str | Path,
    version: int,
    trainables: list[Trainable],
    parallel: ParallelContext,
    *,
    next_prompt_id: int = 0,
    assets_dir: str | Path | None = None,
    keep: int = 0,
    on_device: bool = False,
) -> Path:
    """Write the checkpoint of `version` now; collective under data parallelism (every rank must call).

    `next_prompt_id`: the dataset cursor a resumed run continues from (one past the last prompt trained on).
    `assets_dir`: the tokenizer / generation-config directory copied next to the policy weights.
    `keep`: keep only this many newest checkpoints (0 = all). `on_device`: as for ``snapshot_checkpoint``."""
    snapshot = snapshot_checkpoint(version, trainables, parallel, next_prompt_id=next_prompt_id, on_device=on_device)
    final = step_dir(Path(root), version)
    if parallel.rank == 0:
        write_checkpoint(root, snapshot, assets_dir=assets_dir, keep=keep)
    parallel.barrier()
    return final


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints; returns the deleted paths."""
    complete = sorted(complete_dirs(root), key=version_of)
    doomed = complete[: max(len(complete) - keep, 0)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


# tokenizer files and generation config that make a policy directory loadable on its own
ASSET_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
)


def copy_model_assets(source: Path, policy_dir: Path) -> list[str]:
    """Copy the tokenizer (with its chat template) and generation config next to the saved weights."""
    copied = []
    for name in ASSET_FILES:
        src = source / name
        if src.is_file() and not (policy_dir / name).exists():
            shutil.copyfile(src, policy_dir / name)
            copied.append(name)
    return copied


def load_checkpoint(path: str | Path, trainables: list[Trainable]) -> int:
    """Restore models, optimizers and RNG from `path`; returns the checkpoint's version."""
    path = Path(path)
    state = read_json(path / "trainer_state.json")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: unknown checkpoint format {state.get('format')!r}")
    for trainable in trainables:
        _load_model(trainable, path / trainable.name)
        _load_optimizer(trainable, path / f"{trainable.name}_optimizer")
    _restore_rng(path, state)
    return int(state["version"])


# ---------------------------------------------------------------- model


def _model_state(trainable: Trainable, options: StateDictOptions) -> dict[str, Tensor]:
    return cast(dict[str, Tensor], _state_dict_api().get_model_state_dict(trainable.model, options=options))


def _write_model(trainable: Trainable, model_state: dict[str, Tensor], directory: Path) -> None:
    directory.mkdir(parents=True)
    if has_lora(trainable.raw):  # the adapters next to the merged Hugging Face export
        model_state = lora_files.write_adapter(trainable.raw, model_state, adapter_dir(directory))
    save = getattr(trainable.raw, "save", None)
    if save is not None:  # ValueModel: backbone in HF layout + head
        save(directory, model_state)
    else:
        trainable.raw.save_pretrained(str(directory), state_dict=model_state)  # type: ignore[operator]


def adapter_dir(model_dir: Path) -> Path:
    return model_dir.with_name(f"{model_dir.name}_adapter")


def _load_model(trainable: Trainable, directory: Path) -> None:
    is_lora, has_adapter = has_lora(trainable.raw), adapter_dir(directory).is_dir()
    if is_lora != has_adapter:
        raise CheckpointError(
            f"{directory.parent}: a checkpoint {'with' if has_adapter else 'without'} LoRA adapters cannot resume a "
            f"trainer {'with' if is_lora else 'without'} them; fix: set actor.lora.rank as in the run that wrote "
            "it, or trainer.resume=false (or start from its merged policy/ with model.path)"
        )
    if is_lora:
        adapters = lora_files.read_adapter(trainable.raw, adapter_dir(directory))
        options = _state_dict_api().StateDictOptions(full_state_dict=True, strict=False)
        _state_dict_api().set_model_state_dict(trainable.model, cast(dict[str, Any], adapters), options=options)
        return
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no safetensors files")
    loaded: dict[str, Tensor] = {}
    for file in files:
        prefix = "" if trainable.name == "policy" else _critic_prefix(file)
        loaded.update({prefix + k: v for k, v in load_file(str(file)).items()})
    expected = set(_state_dict_api().get_model_state_dict(trainable.model).keys())
    missing = expected - set(loaded)
    tied = (
        {"lm_head.weight"} if getattr(getattr(trainable.raw, "config", None), "tie_word_embeddings", False) else set()
    )
    if missing - tied or set(loaded) - expected:
        raise CheckpointError(f"{directory}: keys differ from the model (missing {sorted(missing - tied)[:5]}, ...)")
    options = _state_dict_api().StateDictOptions(full_state_dict=True, strict=not missing)
    _state_dict_api().set_model_state_dict(trainable.model, cast(dict[str, Any], loaded), options=options)


def _critic_prefix(file: Path) -> str:
    return "value_head." if file.name.startswith("value_head") else "backbone."


# ---------------------------------------------------------------- optimizer


def _optimizer_state(trainable: Trainable, options: StateDictOptions) -> dict[str, Any]:
    return cast(
        dict[str, Any],
        _state_dict_api().get_optimizer_state_dict(trainable.model, trainable.optimizer, options=options),
    )


def _write_optimizer(optimizer_state: dict[str, Any], stem: Path) -> None:
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for param_name, entries in optimizer_state.get("state", {}).items():
        for key, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"{param_name}{KEY_SEPARATOR}{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(param_name, {})[key] = value
    save_file(tensors, str(stem.with_suffix(".safetensors")))
    meta = {"param_groups": optimizer_state.get("param_groups", []), "scalars": scalars}
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1))


def _load_optimizer(trainable: Trainable, stem: Path) -> None:
    meta = read_json(stem.with_suffix(".json"))
    state: dict[str, dict[str, Any]] = {}
    for key, tensor in load_file(str(stem.with_suffix(".safetensors"))).items():
        param_name, entry = key.rsplit(KEY_SEPARATOR, 1)
        state.setdefault(param_name, {})[entry] = tensor
    for param_name, entries in meta["scalars"].items():
        state.setdefault(param_name, {}).update(entries)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    _state_dict_api().set_optimizer_state_dict(
        trainable.model,
        trainable.optimizer,
        cast(Any, {"state": state, "param_groups": groups}),
        options=_state_dict_api().StateDictOptions(full_state_dict=True),
    )


# ---------------------------------------------------------------- trainer state and RNG


def _rng_states() -> dict[str, Tensor]:
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"torch_cuda_{index}"] = cuda_state
    return rng


def _write_trainer_state(directory: Path, snapshot: CheckpointSnapshot) -> None:
    save_file(snapshot.rng, str(directory / "rng.safetensors"))
    version_tuple, internal, gauss = snapshot.python_random
    state = {"format": FORMAT, "version": snapshot.version, "next_prompt_id": snapshot.next_prompt_id,
             "python_random": [version_tuple, list(internal), gauss]}  # fmt: skip
    (directory / "trainer_state.json").write_text(json.dumps(state))


def _restore_rng(directory: Path, state: dict[str, Any]) -> None:
    rng = load_file(str(directory / "rng.safetensors"))
    torch.set_rng_state(rng["torch_cpu"])
    if torch.cuda.is_available():
        cuda_states = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda_")]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
    version_tuple, internal, gauss = state["python_random"]
    random.setstate((version_tuple, tuple(internal), gauss))


__all__ = ["CheckpointError", "latest_checkpoint", "read_trainer_state"]  # read without torch in psrl.checkpoint_dirs
