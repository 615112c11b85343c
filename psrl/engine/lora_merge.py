"""Merge-on-load of LoRA adapter versions, for an engine that serves plain (merged) weights.

Under ``actor.lora`` a version on the parameter server is the adapters only (``<module>.lora_A``,
``<module>.lora_B``, see `psrl.models.lora`). The engine keeps a copy of the base weight of every
targeted projection, taken as the checkpoint streams in at start, and turns each loaded adapter
pair into ``<module>.weight = base + (alpha / rank) * B @ A``: every version merges onto the base,
never onto the previous merge, so versions do not accumulate rounding and any version can follow
any other.

The latest adapters are kept too (small: rank x (in + out) per projection), so a delta-synced load
that carries only the tensors that changed still merges each touched projection from a whole pair.
A load is all-or-nothing: `prepare` checks every pair before anything is merged and `commit` keeps
the new adapters only once the engine has taken the merged weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from psrl.models.lora import (
    LORA_A,
    AdapterError,
    base_weight_name,
    check_adapter_shapes,
    merge_weight,
    split_adapter_name,
    targeted_module,
)


@dataclass(frozen=True)
class LoraServing:
    """What an engine needs to apply adapters: the targeted projections (HF names), alpha, and how.

    ``mode``: merge = into the base weights on load (this module); unmerged = as LoRA matmuls next to
    the base weights (``lora_unmerged.py``), which allocates the adapters at ``rank`` when the engine starts.
    """

    alpha: float
    target_modules: tuple[str, ...]
    rank: int = 0  # needed by the unmerged mode (0: learnt from the first version, merge mode only)
    mode: Literal["merge", "unmerged"] = "merge"


@dataclass
class AdapterMerger:
    lora: LoraServing
    device: torch.device
    dtype: torch.dtype
    base: dict[str, Tensor] = field(default_factory=dict)  # module -> base weight
    adapters: dict[str, dict[str, Tensor]] = field(default_factory=dict)  # module -> {lora_A, lora_B}
    _staged: dict[str, dict[str, Tensor]] = field(default_factory=dict)

    def capture(self, source: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        """Pass the checkpoint's tensors through, keeping a copy of each targeted base weight."""
        for name, tensor in source:
            self._keep_base(name, tensor)
            yield name, tensor

    def check_targets(self) -> None:
        """Every target projection was found in the checkpoint (AdapterError naming the setting otherwise)."""
        check_targets_found(self.lora.target_modules, {module.rpartition(".")[2] for module in self.base})

    def attach(self, model: object) -> None:
        """Nothing to put on the model: merged weights go through its ordinary weight loading."""

    def prepare(self, named: list[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
        """The tensors to load: plain ones as they are, each adapter pair as its merged base weight.

        Raises AdapterError (nothing changed) for an adapter of no targeted projection, a pair whose
        other half was never loaded, or shapes that do not fit the base."""
        self._staged = {}
        plain: list[tuple[str, Tensor]] = []
        for name, tensor in named:
            parts = split_adapter_name(name)
            if parts is None:
                plain.append((name, tensor))
                continue
            module, kind = parts
            if module not in self.base:
                raise AdapterError(
                    f"{name}: no targeted projection {module} in this engine (engine targets "
                    f"{list(self.lora.target_modules)}; the trainer's actor.lora.target_modules must be the same)"
                )
            self._staged.setdefault(module, {})[kind] = tensor.detach().to(self.device, copy=True)
        merged = [(base_weight_name(module), self._merge(module)) for module in self._staged]
        for name, tensor in plain:  # a full weight replaces the base later adapters merge onto
            self._keep_base(name, tensor)
        return plain + merged

    def commit(self) -> None:
        """The engine took the merged weights: the staged adapters are now the held ones."""
        for module, pair in self._staged.items():
            self.adapters.setdefault(module, {}).update(pair)
        self._staged = {}

    def _merge(self, module: str) -> Tensor:
        pair = {**self.adapters.get(module, {}), **self._staged[module]}
        if len(pair) != 2:
            missing = "lora_B" if LORA_A in pair else "lora_A"
            raise AdapterError(f"{module}.{missing} was never loaded: a version's first load must carry both halves")
        lora_a, lora_b = pair["lora_A"], pair["lora_B"]
        base = self.base[module]
        check_adapter_shapes(module, base.shape, lora_a.shape, lora_b.shape)
        return merge_weight(base, lora_a, lora_b, self.lora.alpha / lora_a.shape[0])

    def _keep_base(self, name: str, tensor: Tensor) -> None:
        module = targeted_module(name, self.lora.target_modules)
        if module is not None:
            self.base[module] = tensor.detach().to(self.device, self.dtype, copy=True)


def check_targets_found(targets: tuple[str, ...], found: set[str]) -> None:
    """AdapterError naming actor.lora.target_modules when a target projection is not in the checkpoint."""
    missing = [target for target in targets if target not in found]
    if missing:
        raise AdapterError(
            f"actor.lora.target_modules={list(targets)}: {missing} are not weights of this "
            f"checkpoint; name projections it has (found {sorted(found)})"
        )
