"""Dense copies of the running sequences' keys/values, so eager decode needs no per-step gather.

Gathering every sequence's blocks out of the paged cache costs as much as the attention itself on
a CPU. While a sequence keeps decoding, its keys/values are also kept in one row of a dense
buffer; each step appends one position per row (besides the write into the paged cache, which
stays the source of truth for prefix sharing and preemption). Rows are compact (0..n-1, in batch
order): a sequence that leaves decode (finished, aborted, preempted) has its row filled by the
last one. A sequence entering decode gets its row filled from its blocks once.

Two layouts share that bookkeeping:
- `DecodeWorkspace`: [layers, rows, capacity, 2, kv_heads, head_dim], read by SDPA as strided views;
- `HeadMajorDecodeWorkspace`: keys and values each [layers, rows, kv_heads, capacity, head_dim],
  the layout of the fused CPU kernels (psrl.kernels.cpu_decode): one head's keys are one
  sequential stream.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from psrl.engine.sequence import Sequence

INITIAL_CAPACITY = 256


class _RowWorkspace(ABC):
    def __init__(self, kv_cache: torch.Tensor, block_size: int, max_rows: int, max_len: int) -> None:
        self.kv_cache = kv_cache  # [layers, blocks, block_size, 2, kv_heads, head_dim]
        self.block_size = block_size
        self.max_rows = max_rows
        self.max_len = max_len
        self.rows: list[Sequence] = []
        self._members: set[Sequence] = set()  # the sequences in rows, as of the last sync
        self.capacity = 0
        self._resize(min(INITIAL_CAPACITY, max_len))

    def sync(self, seqs: list[Sequence]) -> list[Sequence]:
        """Make the rows hold exactly `seqs`; returns them in row order (the order the step must use)."""
        longest = max(seq.num_tokens for seq in seqs)
        if longest > self.capacity:
            capacity = self.capacity
            while capacity < longest:
                capacity *= 2
            self._resize(min(capacity, self.max_len))
        if len(seqs) == len(self._members) and all(seq in self._members for seq in seqs):
            return list(self.rows)  # most steps: the same sequences as the last one
        members = set(seqs)
        for row in reversed(range(len(self.rows))):
            if self.rows[row] not in members:
                self._drop(row)
        present = set(self.rows)
        for seq in seqs:
            if seq not in present:
                self._add(seq)
        self._members = set(self.rows)
        return list(self.rows)

    def _drop(self, row: int) -> None:
        last = len(self.rows) - 1
        if row != last:
            self._move_row(last, row, self.rows[last].num_computed_tokens)
            self.rows[row] = self.rows[last]
        self.rows.pop()

    def _add(self, seq: Sequence) -> None:
        if len(self.rows) >= self.max_rows:
            raise RuntimeError(f"decode workspace holds at most {self.max_rows} sequences")
        length = seq.num_computed_tokens
        blocks = self.kv_cache[:, seq.block_table]  # [layers, blocks, block_size, 2, kv_heads, head_dim]
        self._fill_row(len(self.rows), blocks.flatten(1, 2)[:, :length])
        self.rows.append(seq)

    @abstractmethod
    def _move_row(self, source: int, target: int, length: int) -> None:
        """Copy the first `length` positions of row `source` into row `target`."""

    @abstractmethod
    def _fill_row(self, row: int, kv: torch.Tensor) -> None:
        """Write kv [layers, length, 2, kv_heads, head_dim] into the first positions of `row`."""

    @abstractmethod
    def _resize(self, capacity: int) -> None:
        """Reallocate for `capacity` positions per row, keeping the rows' contents; sets self.capacity."""

    def _empty(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.kv_cache.dtype, device=self.kv_cache.device)


class DecodeWorkspace(_RowWorkspace):
    buffer: torch.Tensor  # [layers, rows, capacity, 2, kv_heads, head_dim]

    def _move_row(self, source: int, target: int, length: int) -> None:
        self.buffer[:, target, :length] = self.buffer[:, source, :length]

    def _fill_row(self, row: int, kv: torch.Tensor) -> None:
        self.buffer[:, row, : kv.shape[1]] = kv

    def _resize(self, capacity: int) -> None:
        layers, _, _, _, kv_heads, head_dim = self.kv_cache.shape
        bigger = self._empty(layers, self.max_rows, capacity, 2, kv_heads, head_dim)
        if self.capacity:
            bigger[:, :, : self.capacity] = self.buffer
        self.buffer, self.capacity = bigger, capacity


class HeadMajorDecodeWorkspace(_RowWorkspace):
    """The fused CPU kernels' layout: each head's keys (and values) of a row are one sequential stream."""

    keys: torch.Tensor  # [layers, rows, kv_heads, capacity, head_dim]
    values: torch.Tensor  # [layers, rows, kv_heads, capacity, head_dim]

    def _move_row(self, source: int, target: int, length: int) -> None:
        for buffer in (self.keys, self.values):
            buffer[:, target, :, :length] = buffer[:, source, :, :length]

    def _fill_row(self, row: int, kv: torch.Tensor) -> None:
        length = kv.shape[1]
        self.keys[:, row, :, :length] = kv[:, :, 0].transpose(1, 2)
        self.values[:, row, :, :length] = kv[:, :, 1].transpose(1, 2)

    def _resize(self, capacity: int) -> None:
        layers, _, _, _, kv_heads, head_dim = self.kv_cache.shape
        keys = self._empty(layers, self.max_rows, kv_heads, capacity, head_dim)
        values = self._empty(layers, self.max_rows, kv_heads, capacity, head_dim)
        if self.capacity:
            keys[:, :, :, : self.capacity] = self.keys
            values[:, :, :, : self.capacity] = self.values
        self.keys, self.values, self.capacity = keys, values, capacity
