"""Unmerged LoRA serving: the base weights stay as loaded and each targeted projection adds its adapters.

The engine's projections are fused (q|k|v, gate|up; `psrl.models.llama`), so each fused projection
gets one pair of tensors holding the adapters of all its targeted parts: ``lora_a_t`` [in, parts x rank]
is the parts' ``A^T`` side by side, ``lora_b_t`` [parts x rank, out] is block-structured, each part's
``scaling * B^T`` in its own rank rows and output columns (zeros elsewhere, and q/k's output columns
interleaved like the base weight). The projection then adds ``(x @ lora_a_t) @ lora_b_t`` to its
output, which is ``x @ (scaling * B @ A)^T`` for every part at once: two small matmuls per fused
projection instead of one per part.

The tensors are allocated when the engine starts (zeros: the base model until the first version) and
loads copy into them in place, so captured CUDA graphs and the fused CPU decoder keep reading the
same memory. A load is all-or-nothing as in merge mode: `prepare` checks and stages every adapter
tensor, `commit` copies them once the engine has taken the rest of the update. A delta-synced load
may carry one half of a pair; the other half is the one already in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from psrl.engine.lora_merge import AdapterMerger, LoraServing, check_targets_found
from psrl.models.lora import LORA_A, LORA_B, AdapterError, split_adapter_name, targeted_module
from psrl.models.weights import projection_parts, to_interleaved_halves

if TYPE_CHECKING:
    from psrl.models.llama import DecoderLayer, DecoderModel, Projection


@dataclass(frozen=True)
class AdapterSlot:
    """Where one HF module's adapters live inside its fused projection's LoRA tensors."""

    a_t: Tensor  # [in, rank], a view of the projection's lora_a_t
    b_t: Tensor  # [rank, out of this part], a view of the projection's lora_b_t
    num_interleaved_heads: int

    def expected_shapes(self) -> dict[str, tuple[int, int]]:
        in_features, rank = self.a_t.shape
        return {LORA_A: (rank, in_features), LORA_B: (self.b_t.shape[1], rank)}


@dataclass
class UnmergedAdapters:
    lora: LoraServing
    device: torch.device
    dtype: torch.dtype
    slots: dict[str, AdapterSlot] = field(default_factory=dict)  # HF module -> its slot
    loaded: dict[str, set[str]] = field(default_factory=dict)  # module -> halves loaded so far
    _found: set[str] = field(default_factory=set)
    _staged: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    _pinned: Tensor | None = None  # host staging for the copy to the device, kept between loads
    _copied: torch.cuda.Event | None = None

    def __post_init__(self) -> None:
        if self.lora.rank < 1:
            raise AdapterError(
                f"engine.lora_mode=unmerged allocates the adapters when the engine starts and needs their rank: "
                f"actor.lora.rank={self.lora.rank}; set actor.lora.rank > 0 (or engine.lora_mode=merge)"
            )

    @property
    def scaling(self) -> float:
        return self.lora.alpha / self.lora.rank

    def capture(self, source: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        """Pass the checkpoint through, noting which targets it has (no base weights are kept)."""
        for name, tensor in source:
            module = targeted_module(name, self.lora.target_modules)
            if module is not None:
                self._found.add(module.rpartition(".")[2])
            yield name, tensor

    def check_targets(self) -> None:
        check_targets_found(self.lora.target_modules, self._found)

    def attach(self, model: DecoderModel) -> None:
        """Give every fused projection with a targeted part its zero adapters (on the engine's device)."""
        for index, layer in enumerate(model.layers):
            by_projection: dict[int, list[tuple[str, int, int, int]]] = {}
            projections: dict[int, Projection] = {}
            for local, (projection, start, size, heads) in projection_parts(cast("DecoderLayer", layer)).items():
                if local.rpartition(".")[2] in self.lora.target_modules:
                    by_projection.setdefault(id(projection), []).append((local, start, size, heads))
                    projections[id(projection)] = projection
            for key, parts in by_projection.items():
                self._attach_projection(f"model.layers.{index}", projections[key], parts)

    def _attach_projection(self, prefix: str, projection: Projection, parts: list[tuple[str, int, int, int]]) -> None:
        rank = self.lora.rank
        in_features, out_features = projection.weight_t.shape
        a_t = torch.zeros(in_features, rank * len(parts), device=self.device, dtype=self.dtype)
        b_t = torch.zeros(rank * len(parts), out_features, device=self.device, dtype=self.dtype)
        projection.lora_a_t, projection.lora_b_t = a_t, b_t
        for number, (local, start, size, heads) in enumerate(parts):
            rows = slice(number * rank, (number + 1) * rank)
            self.slots[f"{prefix}.{local}"] = AdapterSlot(a_t[:, rows], b_t[rows, start : start + size], heads)

    def prepare(self, named: list[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
        """The plain tensors to load; adapter tensors are checked and staged (AdapterError: nothing changed)."""
        self._staged = {}
        plain: list[tuple[str, Tensor]] = []
        for name, tensor in named:
            parts = split_adapter_name(name)
            if parts is None:
                plain.append((name, tensor))
                continue
            module, kind = parts
            self._check(name, module, kind, tensor)
            self._staged.setdefault(module, {})[kind] = tensor
        for module, pair in self._staged.items():
            missing = {LORA_A, LORA_B} - set(pair) - self.loaded.get(module, set())
            if missing:
                raise AdapterError(
                    f"{module}.{missing.pop()} was never loaded: a version's first load must carry both halves"
                )
        return plain

    def _check(self, name: str, module: str, kind: str, tensor: Tensor) -> None:
        slot = self.slots.get(module)
        if slot is None:
            raise AdapterError(
                f"{name}: no targeted projection {module} in this engine (engine targets "
                f"{list(self.lora.target_modules)}; the trainer's actor.lora.target_modules must be the same)"
            )
        want = slot.expected_shapes()[kind]
        if tuple(tensor.shape) != want:
            raise AdapterError(
                f"{name}: shape {tuple(tensor.shape)}, expected {want} (engine.lora_mode=unmerged serves rank "
                f"{self.lora.rank}: the trainer's actor.lora.rank)"
            )

    def commit(self) -> None:
        """Copy the staged adapters into place (A^T; scaling * B^T with q/k's columns interleaved)."""
        staged = self._on_device(self._staged)
        with torch.no_grad():
            for module, pair in staged.items():
                slot = self.slots[module]
                if LORA_A in pair:
                    slot.a_t.copy_(pair[LORA_A].t())
                if LORA_B in pair:
                    lora_b = pair[LORA_B].to(torch.float32) * self.scaling
                    if slot.num_interleaved_heads:
                        lora_b = to_interleaved_halves(lora_b, slot.num_interleaved_heads)
                    slot.b_t.copy_(lora_b.t())
                self.loaded.setdefault(module, set()).update(pair)
        self._staged = {}

    def _on_device(self, staged: dict[str, dict[str, Tensor]]) -> dict[str, dict[str, Tensor]]:
        """The staged tensors on the engine's device, moved in one copy through a reused pinned buffer.

        A version has two tensors per targeted module (about 400 at 1.5B); copied one by one from
        pageable memory, each copy waits for the device and the load is dominated by those waits.
        """
        tensors = [t for pair in staged.values() for t in pair.values()]
        if self.device.type != "cuda" or not tensors or any(t.device.type != "cpu" for t in tensors):
            return staged
        dtype = tensors[0].dtype
        if any(t.dtype != dtype for t in tensors):
            return {m: {k: t.to(self.device) for k, t in pair.items()} for m, pair in staged.items()}
        total = sum(t.numel() for t in tensors)
        if self._pinned is None or self._pinned.numel() < total or self._pinned.dtype != dtype:
            self._pinned = torch.empty(total, dtype=dtype, pin_memory=True)
        if self._copied is not None:
            self._copied.synchronize()  # the previous load's copy may still be reading the buffer
        host = self._pinned[:total]
        torch.cat([t.reshape(-1) for t in tensors], out=host)
        flat = host.to(self.device, non_blocking=True)
        self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._copied.record()
        moved: dict[str, dict[str, Tensor]] = {}
        offset = 0
        for module, pair in staged.items():
            for kind, tensor in pair.items():
                moved.setdefault(module, {})[kind] = flat[offset : offset + tensor.numel()].view(tensor.shape)
                offset += tensor.numel()
        return moved


def lora_applier(lora: LoraServing, device: torch.device, dtype: torch.dtype) -> AdapterMerger | UnmergedAdapters:
    """The engine's LoRA serving for ``lora.mode`` (engine.lora_mode)."""
    if lora.mode == "unmerged":
        return UnmergedAdapters(lora, device, dtype)
    return AdapterMerger(lora, device, dtype)
