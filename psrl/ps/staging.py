"""Host staging: the trainer's weights as contiguous CPU tensors, the form a push sends from.

A trainer on a GPU holds its weights in device memory, while the PS transports send host bytes.
Each device (or non-contiguous) tensor is copied into a host buffer kept from one push to the next
(pinned when CUDA is present, so the copies are asynchronous DMA), with one synchronisation after
the last copy. CPU tensors that are already contiguous pass through without a copy, which keeps a
CPU trainer's push zero-copy.

With ``cast_to`` (the rollout engine's dtype, when shards serve it), floating tensors are cast on
their own device before the copy: a bf16 engine fed by an fp32 GPU trainer then moves half the
bytes device-to-host and through the PS, and the shards have nothing left to cast. Rounding is the
same round-to-nearest-even the shards would apply, so the served bytes do not change.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from psrl.ps.checksum import WORD_BYTES


class HostStaging:
    def __init__(self, cast_to: torch.dtype | None = None) -> None:
        self.cast_to = cast_to
        self._buffers: dict[str, torch.Tensor] = {}
        self._landed: dict[str, torch.cuda.Event] = {}  # copies still in flight after stage(wait=False)

    def stage(self, weights: Mapping[str, torch.Tensor], wait: bool = True) -> dict[str, torch.Tensor]:
        """Host copies of ``weights`` (same names, shapes and dtypes), valid until the next call.

        ``wait=False`` returns while device copies are still in flight: ``wait_for(name)`` before
        reading a tensor (a push hashes each one as soon as it landed, overlapping the copies).
        """
        staged: dict[str, torch.Tensor] = {}
        devices: set[torch.device] = set()
        self._landed = {}
        for name, weight in weights.items():
            tensor = weight.detach().to(self.cast_to) if self._casts(weight) else weight
            if tensor.device.type == "cpu" and tensor.is_contiguous():
                staged[name] = tensor
                continue
            buffer = self._buffer_for(name, tensor)
            buffer.copy_(tensor, non_blocking=tensor.device.type == "cuda")
            devices.add(tensor.device)
            staged[name] = buffer
            if not wait and tensor.device.type == "cuda":
                self._landed[name] = torch.cuda.Event()  # type: ignore[no-untyped-call]
                self._landed[name].record(torch.cuda.current_stream(tensor.device))
        for device in devices:
            if wait and device.type == "cuda":
                torch.cuda.synchronize(device)
        return staged

    def wait_for(self, name: str) -> None:
        """Block until the staged copy of ``name`` landed (a no-op once it has, or after a waiting stage)."""
        event = self._landed.get(name)
        if event is not None:
            event.synchronize()

    def _casts(self, tensor: torch.Tensor) -> bool:
        return pushed_dtype(tensor, self.cast_to) != tensor.dtype

    @property
    def num_staged_bytes(self) -> int:
        """Host memory held for staging."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def _buffer_for(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = tensor.device.type == "cuda"
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[name] = buffer
        return buffer


class DeviceWeights:
    """The trainer's device tensors as a push reads them, for transports that copy from the device
    straight into the shard's memory (shared memory on one host): no host staging buffer, no host copy.

    ``meta`` describes each tensor as pushed (cast to ``cast_to``); ``cast(name)`` makes the pushed form
    on its device when a transport copies it, so at most one cast tensor is alive at a time.
    """

    def __init__(self, weights: Mapping[str, torch.Tensor], cast_to: torch.dtype | None = None) -> None:
        self.weights = weights
        self.cast_to = cast_to
        self.meta = {n: torch.empty(w.shape, dtype=pushed_dtype(w, cast_to), device="meta") for n, w in weights.items()}

    def cast(self, name: str) -> torch.Tensor:
        weight = self.weights[name].detach()
        dtype = pushed_dtype(weight, self.cast_to)
        return (weight if weight.dtype == dtype else weight.to(dtype)).contiguous()


class WeightSnapshot:
    """A copy of the trainer's weights as they are pushed (floating tensors cast to ``cast_to``), where they
    lie, in buffers kept from one version to the next: a push reads it while the next step changes the
    weights (``trainer.background_push``). On a GPU the copy is queued on the trainer's stream and
    ``ready`` is recorded after it, so a push on another stream waits for exactly that point."""

    def __init__(self, cast_to: torch.dtype | None = None) -> None:
        self.cast_to = cast_to
        self.ready: torch.cuda.Event | None = None
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copy ``weights`` into the snapshot's buffers; the result is valid until the next ``take``, so the
        push that reads it must have finished by then."""
        taken: dict[str, torch.Tensor] = {}
        devices: set[torch.device] = set()
        for name, weight in weights.items():
            dtype = pushed_dtype(weight, self.cast_to)
            buffer = self._buffers.get(name)
            if buffer is None or (buffer.shape, buffer.dtype, buffer.device) != (weight.shape, dtype, weight.device):
                buffer = self._buffers[name] = torch.empty(weight.shape, dtype=dtype, device=weight.device)
            buffer.copy_(weight.detach())
            taken[name] = buffer
            devices.add(weight.device)
        self.ready = None
        cuda = [d for d in devices if d.type == "cuda"]
        if cuda:
            self.ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.ready.record(torch.cuda.current_stream(cuda[0]))
        return taken


def pushed_dtype(weight: torch.Tensor, cast_to: torch.dtype | None) -> torch.dtype:
    """The dtype ``weight`` is pushed in: ``cast_to`` for floating tensors when given, else its own."""
    return cast_to if cast_to is not None and weight.is_floating_point() else weight.dtype


def pushed_num_bytes(weights: Mapping[str, torch.Tensor], cast_to: torch.dtype | None) -> int:
    """The bytes ``weights`` take as pushed."""
    return sum(w.numel() * pushed_dtype(w, cast_to).itemsize for w in weights.values())


def on_device(weights: Mapping[str, torch.Tensor]) -> bool:
    """Whether every tensor lives on a CUDA device (what ``DeviceWeights`` pushes are for)."""
    return bool(weights) and all(w.device.type == "cuda" for w in weights.values())


def word_sum_on_device(source: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The word sum (``psrl.ps.checksum``) of the flat bytes ``source[start:end]``, computed where they lie:
    a 0-d int64 tensor (integer addition wraps, so it equals the host's sum modulo 2**64 in any order)."""
    whole = start + (end - start) // WORD_BYTES * WORD_BYTES
    head = source[start:whole]
    if head.storage_offset() % WORD_BYTES:
        head = head.clone()
    total = head.view(torch.int64).sum()
    if whole < end:  # the tail, zero-padded to a word: byte i weighs 256**i
        tail = source[whole:end].to(torch.int64)
        shifts = torch.arange(end - whole, device=source.device, dtype=torch.int64) * 8
        total = total + (tail << shifts).sum()
    return total
