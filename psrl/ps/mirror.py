"""The puller's host buffers: one tensor per name, received into in place, kept across pulls.

Entries land straight in their tensor's bytes (a split tensor is assembled where it lands), so a
tensor handed to the engine is a view of these buffers with no copy after the receive. Reusing the
buffers across pulls keeps their pages warm.

For delta sync the mirror also knows, for every entry, the manifest entry whose bytes it holds, so
the next pull fetches exactly the entries whose checksum (or layout) differs. An entry is forgotten
before the first byte of it is written (``destination``) and held again only once its new bytes
are verified (``landed``), so a pull that fails halfway never leaves an entry that claims bytes it
does not have. A tensor whose bytes changed but which was not yet handed to the engine stays
*dirty* and is loaded by the next successful pull even if nothing else in it changes.

Sparse deltas apply to the bytes of one version, the *base*: the last version the mirror held
whole and verified (``settle``). Only entries still held exactly as in the base may come sparse
(``base_for``, ``holds_base``); any other needed entry, such as one a failed pull rewrote, comes whole.

For a CUDA engine (``pin_memory``) the buffers are page-locked once, so the engine's copies of
assembled tensors run at pinned host-to-device speed: at 7B most bytes are in tensors split into
blocks, which a shared-memory pull assembles here rather than handing out in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from psrl.ps import pinning
from psrl.ps.dtypes import byte_view, dtype_from_name
from psrl.ps.manifest import ManifestEntry
from psrl.ps.versions import NONE


def _place(entry: ManifestEntry) -> tuple[object, ...]:
    return entry.name, entry.shape, entry.dtype, entry.elem_start, entry.num_elems


def _same_place(a: ManifestEntry, b: ManifestEntry) -> bool:
    return _place(a) == _place(b)


def _same_bytes(a: ManifestEntry, b: ManifestEntry) -> bool:
    return _same_place(a, b) and a.checksum == b.checksum


class Mirror:
    def __init__(self, pin_memory: bool = False) -> None:
        self.pin_memory = pin_memory
        self._tensors: dict[str, torch.Tensor] = {}
        self._pinned: dict[str, int] = {}  # name -> registered address
        self._held: dict[int, ManifestEntry] = {}
        self._dirty: set[str] = set()
        self._base_version = NONE
        self._base: dict[int, ManifestEntry] = {}

    def prepare(self, entries: Sequence[ManifestEntry]) -> None:
        """Allocate (or re-allocate on a layout change) a tensor for every name in the version."""
        for entry in entries:
            if self._fits(entry):
                continue
            self._allocate(entry)
            for index in [i for i, held in self._held.items() if held.name == entry.name]:
                del self._held[index]
            self._dirty.add(entry.name)

    def _allocate(self, entry: ManifestEntry) -> None:
        self._release(entry.name)
        tensor = torch.empty(entry.shape, dtype=dtype_from_name(entry.dtype))
        self._tensors[entry.name] = tensor
        if self.pin_memory and tensor.numel():
            address = pinning.register(byte_view(tensor))
            if address is not None:
                self._pinned[entry.name] = address

    def _release(self, name: str) -> None:
        address = self._pinned.pop(name, None)
        if address is not None:
            pinning.unregister(address)

    def close(self) -> None:
        """Unlock the pinned buffers (the tensors themselves go with the last reference)."""
        for name in list(self._pinned):
            self._release(name)

    def changed(self, entries: Sequence[ManifestEntry]) -> list[ManifestEntry]:
        """Entries whose bytes the mirror does not hold."""
        out = []
        for entry in entries:
            held = self._held.get(entry.index)
            if held is None or not _same_bytes(held, entry) or not self._fits(entry):
                out.append(entry)
        return out

    def settle(self, version: int, entries: Sequence[ManifestEntry]) -> None:
        """The mirror now holds ``version`` whole, every entry verified: the base of the next deltas."""
        self._base_version = version
        self._base = {entry.index: entry for entry in entries}

    def holds_base(self, entry: ManifestEntry) -> bool:
        """Whether the bytes held where ``entry`` goes are exactly the base version's."""
        held, base = self._held.get(entry.index), self._base.get(entry.index)
        if held is None or base is None:
            return False
        return _same_bytes(held, base) and _same_place(base, entry) and self._fits(entry)

    def base_for(self, entries: Sequence[ManifestEntry]) -> tuple[int, tuple[int, ...]]:
        """(base version, indices of ``entries`` held exactly as in it), or (NONE, ()) without a base."""
        indices = tuple(e.index for e in entries if self.holds_base(e))
        return (self._base_version, indices) if indices else (NONE, ())

    def destination(self, entry: ManifestEntry) -> memoryview:
        """Where ``entry``'s bytes go (its slice of the tensor); the entry is untrusted until ``landed``."""
        self._held.pop(entry.index, None)
        self._dirty.add(entry.name)
        return self.entry_view(entry)

    def landed(self, entry: ManifestEntry) -> None:
        """``entry``'s bytes were received and verified."""
        self._held[entry.index] = entry

    def forget(self, entry: ManifestEntry) -> None:
        """The bytes of ``entry`` are not trusted any more (the next pull fetches them)."""
        self._held.pop(entry.index, None)
        self._dirty.add(entry.name)

    def take(self, name: str) -> torch.Tensor:
        """The tensor, now considered loaded by the engine."""
        self._dirty.discard(name)
        return self._tensors[name]

    def mark_dirty(self, name: str) -> None:
        self._dirty.add(name)

    def take_dirty(self) -> list[str]:
        names = sorted(self._dirty)
        self._dirty.clear()
        return names

    def tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def entry_view(self, entry: ManifestEntry) -> memoryview:
        start, stop = entry.byte_range()
        return byte_view(self._tensors[entry.name])[start:stop]

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def _fits(self, entry: ManifestEntry) -> bool:
        tensor = self._tensors.get(entry.name)
        return (
            tensor is not None and tuple(tensor.shape) == entry.shape and tensor.dtype == dtype_from_name(entry.dtype)
        )
