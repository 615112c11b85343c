"""Decode steps at fixed shapes, replayed as CUDA graphs.

An eager decode step launches a few hundred small kernels, so on a GPU it is bound by launch
overhead, not by memory bandwidth. Here the batch is padded to a bucket size and every sequence's
block table to a bucket width; each (batch, width) pair gets its step (model forward + logits)
captured once as a CUDA graph and replayed afterwards. Inputs travel in one packed int64 buffer
(one host-to-device copy per step). Padding rows write into a scratch KV block that the block
manager never hands out, and attend only to it.

Without CUDA the same bucketed step runs eagerly, which is how its padding logic is tested on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
import torch

from psrl.engine.graph_capture import GraphCapture, plain_capture
from psrl.engine.sequence import Sequence
from psrl.models.attention import AttentionBatch
from psrl.models.llama import DecoderModel

log = structlog.get_logger(__name__)


def buckets(limit: int) -> list[int]:
    """1, 2, 4, ... up to and including `limit`."""
    sizes = [1]
    while sizes[-1] < limit:
        sizes.append(min(sizes[-1] * 2, limit))
    return sizes


@dataclass
class _Entry:
    batch_size: int
    num_blocks_per_seq: int
    packed: torch.Tensor  # [3 * B + B * num_blocks_per_seq] int64 on the device
    logits: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None


class DecodeGraphRunner:
    def __init__(
        self,
        model: DecoderModel,
        kv_cache: torch.Tensor,
        block_size: int,
        scratch_block: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        use_graphs: bool,
        capture: GraphCapture = plain_capture,
    ) -> None:
        self.model = model
        self.capture = capture
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.batch_buckets = buckets(max_num_seqs)
        self.block_buckets = buckets(max_blocks_per_seq)
        self.use_graphs = use_graphs
        self.device = kv_cache.device
        self._entries: dict[tuple[int, int], _Entry] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_graphs else None

    def run(self, seqs: list[Sequence]) -> torch.Tensor:
        """fp32 logits [len(seqs), vocab] for one decode step of `seqs`."""
        batch_size = _bucket(len(seqs), self.batch_buckets)
        width = _bucket(max(len(seq.block_table) for seq in seqs), self.block_buckets)
        entry = self._entries.get((batch_size, width)) or self._create(batch_size, width)
        entry.packed.copy_(self._pack(seqs, batch_size, width), non_blocking=True)
        if entry.graph is not None:
            entry.graph.replay()
        else:
            entry.logits = self._forward(entry)
        if entry.logits is None:
            raise RuntimeError("decode step produced no logits")
        return entry.logits[: len(seqs)]

    def _pack(self, seqs: list[Sequence], batch_size: int, width: int) -> torch.Tensor:
        block_size, scratch = self.block_size, self.scratch_block
        positions = [seq.num_tokens - 1 for seq in seqs]
        num_pad = batch_size - len(seqs)
        input_ids = [seq.token_ids[-1] for seq in seqs] + [0] * num_pad
        slots = [
            seq.block_table[p // block_size] * block_size + p % block_size
            for seq, p in zip(seqs, positions, strict=True)
        ]
        tables: list[int] = []
        for seq in seqs:
            tables += seq.block_table + [scratch] * (width - len(seq.block_table))
        tables += [scratch] * (width * num_pad)
        values = input_ids + positions + [0] * num_pad + slots + [scratch * block_size] * num_pad + tables
        return torch.tensor(values, dtype=torch.int64, pin_memory=self.device.type == "cuda")

    def _forward(self, entry: _Entry) -> torch.Tensor:
        batch_size, width = entry.batch_size, entry.num_blocks_per_seq
        packed = entry.packed
        input_ids, positions, slots = (packed[i * batch_size : (i + 1) * batch_size] for i in range(3))
        tables = packed[3 * batch_size :]
        num_key_slots = width * self.block_size
        key_index = torch.arange(num_key_slots, device=self.device)
        mask = key_index.unsqueeze(0) <= positions.unsqueeze(1)
        attention = AttentionBatch(
            slot_mapping=slots,
            block_tables=tables,
            mask=mask.view(batch_size, 1, 1, num_key_slots),
            num_seqs=batch_size,
            max_query_len=1,
            num_key_slots=num_key_slots,
            query_pad_index=None,
        )
        hidden = self.model(input_ids, positions, self.kv_cache, attention)
        return self.model.compute_logits(hidden)

    def _create(self, batch_size: int, width: int) -> _Entry:
        packed = torch.zeros(3 * batch_size + batch_size * width, dtype=torch.int64, device=self.device)
        # padding content: positions 0, scratch slot and blocks, so a capture runs on valid indices
        packed[2 * batch_size : 3 * batch_size] = self.scratch_block * self.block_size
        packed[3 * batch_size :] = self.scratch_block
        entry = _Entry(batch_size, width, packed)
        if self.use_graphs:
            try:
                self._capture(entry)
            except RuntimeError as error:  # keep serving eagerly rather than die on a capture problem
                log.warning("decode_graph_capture_failed", error=str(error))
                self.use_graphs = False
                entry.graph = None
        self._entries[(batch_size, width)] = entry
        return entry

    def _capture(self, entry: _Entry) -> None:
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocator, library handles)
                self._forward(entry)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with self.capture(graph, self._pool):
            entry.logits = self._forward(entry)
        entry.graph = graph
        log.debug("decode_graph_captured", batch=entry.batch_size, blocks_per_seq=entry.num_blocks_per_seq)


def _bucket(value: int, sizes: list[int]) -> int:
    for size in sizes:
        if size >= value:
            return size
    raise ValueError(f"{value} exceeds the largest bucket {sizes[-1]}")
