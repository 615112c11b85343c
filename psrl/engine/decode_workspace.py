"""A dense copy of the running sequences' keys/values, so eager decode needs no per-step gather.

Gathering every sequence's blocks out of the paged cache costs as much as the attention itself on
a CPU. While a sequence keeps decoding, its keys/values are also kept in one row of a dense buffer
[layers, rows, capacity, 2, kv_heads, head_dim]; each step appends one position per row (besides
the write into the paged cache, which stays the source of truth for prefix sharing and
preemption), and attention reads the rows as a strided view. Rows are compact (0..n-1, in batch
order): a sequence that leaves decode (finished, aborted, preempted) has its row filled by the
last one. A sequence entering decode gets its row filled from its blocks once.
"""

from __future__ import annotations

import torch

from psrl.engine.sequence import Sequence

INITIAL_CAPACITY = 256


class DecodeWorkspace:
    def __init__(self, kv_cache: torch.Tensor, block_size: int, max_rows: int, max_len: int) -> None:
        self.kv_cache = kv_cache  # [layers, blocks, block_size, 2, kv_heads, head_dim]
        self.block_size = block_size
        self.max_rows = max_rows
        self.max_len = max_len
        self.rows: list[Sequence] = []
        self.buffer = self._allocate(min(INITIAL_CAPACITY, max_len))

    @property
    def capacity(self) -> int:
        return self.buffer.shape[2]

    def sync(self, seqs: list[Sequence]) -> list[Sequence]:
        """Make the rows hold exactly `seqs`; returns them in row order (the order the step must use)."""
        members = set(seqs)
        for row in reversed(range(len(self.rows))):
            if self.rows[row] not in members:
                self._drop(row)
        longest = max(seq.num_tokens for seq in seqs)
        if longest > self.capacity:
            self._grow(longest)
        present = set(self.rows)
        for seq in seqs:
            if seq not in present:
                self._add(seq)
        return list(self.rows)

    def _drop(self, row: int) -> None:
        last = len(self.rows) - 1
        if row != last:
            length = self.rows[last].num_computed_tokens
            self.buffer[:, row, :length] = self.buffer[:, last, :length]
            self.rows[row] = self.rows[last]
        self.rows.pop()

    def _add(self, seq: Sequence) -> None:
        if len(self.rows) >= self.max_rows:
            raise RuntimeError(f"decode workspace holds at most {self.max_rows} sequences")
        row = len(self.rows)
        length = seq.num_computed_tokens
        blocks = self.kv_cache[:, seq.block_table]  # [layers, blocks, block_size, 2, kv_heads, head_dim]
        self.buffer[:, row, :length] = blocks.flatten(1, 2)[:, :length]
        self.rows.append(seq)

    def _grow(self, length: int) -> None:
        capacity = self.capacity
        while capacity < length:
            capacity *= 2
        bigger = self._allocate(min(capacity, self.max_len))
        bigger[:, :, : self.capacity] = self.buffer
        self.buffer = bigger

    def _allocate(self, capacity: int) -> torch.Tensor:
        layers, _, _, _, kv_heads, head_dim = self.kv_cache.shape
        shape = (layers, self.max_rows, capacity, 2, kv_heads, head_dim)
        return torch.zeros(shape, dtype=self.kv_cache.dtype, device=self.kv_cache.device)
