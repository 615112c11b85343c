"""The puller's host buffers: one tensor per name, received into in place, kept across pulls.

Entries land straight in their tensor's bytes (a split tensor is assembled where it lands), so a
tensor handed to the engine is a view of these buffers with no copy after the receive. Reusing the
buffers across pulls keeps their pages warm.

For delta sync the mirror also knows, for every entry, the manifest entry whose bytes it holds, so
the next pull fetches exactly the entries whose checksum (or layout) differs. A tensor whose bytes
changed but which was not yet handed to the engine (a pull failed halfway through it) stays *dirty*
and is loaded by the next successful pull even if nothing else in it changes.

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


def _same_bytes(a: ManifestEntry, b: ManifestEntry) -> bool:
    return (a.name, a.shape, a.dtype, a.elem_start, a.num_elems, a.checksum) == (
        b.name,
        b.shape,
        b.dtype,
        b.elem_start,
        b.num_elems,
        b.checksum,
    )


class Mirror:
    def __init__(self, pin_memory: bool = False) -> None:
        self.pin_memory = pin_memory
        self._tensors: dict[str, torch.Tensor] = {}
        self._pinned: dict[str, int] = {}  # name -> registered address
        self._held: dict[int, ManifestEntry] = {}
        self._dirty: set[str] = set()

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
