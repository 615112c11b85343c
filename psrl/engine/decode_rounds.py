"""Decode rounds: several decode steps per scheduling round, sampled on the device, replayed as CUDA graphs.

A round runs `num_steps` steps for every running sequence without returning to the host: each step
computes its cache slots from the positions and block tables, runs the forward pass through the
step kernels (psrl.models.kernel_forward), samples on the device and feeds the sampled tokens to
the next step. The host then reads all tokens and log-probabilities at once and truncates each
sequence at its first stop token or length limit (the engine does that). The scheduler has
allocated the blocks a round can fill; positions past a row's blocks (steps after its end) write
to the scratch block. Rows are padded to a batch bucket, and each (bucket, steps) pair is captured
once as a CUDA graph; padding rows own no blocks, attend to nothing and write to the scratch block.

Inputs travel in two host-to-device copies per round: an int32 row of fields per sequence and the
block tables. A sequence keeps its table row from round to round, so a round rewrites only the
blocks added since the last one (and the rows of sequences that joined).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import structlog
import torch

from psrl.engine.graph_capture import GraphCapture, plain_capture
from psrl.engine.sequence import Sequence
from psrl.models.kernel_forward import KernelForward

log = structlog.get_logger(__name__)

# int32 fields per row: last token, its position, blocks owned, seed (low word, high word), temperature bits
TOKEN, POSITION, NUM_BLOCKS, SEED_LOW, SEED_HIGH, TEMPERATURE = range(6)
NUM_FIELDS = 6


def round_buckets(limit: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, then steps of 8 to 64, 16 to 128, 32 to 256, 64 beyond; always `limit`."""
    sizes = [1, 2, 4, 8]
    while sizes[-1] < limit:
        last = sizes[-1]
        sizes.append(last + (8 if last < 64 else 16 if last < 128 else 32 if last < 256 else 64))
    return sorted({min(size, limit) for size in sizes})


@dataclass(frozen=True, slots=True)
class RoundShape:
    block_size: int
    scratch_block: int
    max_num_seqs: int
    max_blocks_per_seq: int
    max_model_len: int
    max_steps: int


@dataclass(slots=True)
class RoundResult:
    token_ids: list[list[int]]  # per sequence (in the order given), one token per step
    logprobs: list[list[float]]


class DecodeRounds:
    def __init__(
        self,
        forward: KernelForward,
        kv_cache: torch.Tensor,
        shape: RoundShape,
        use_graphs: bool,
        capture: GraphCapture = plain_capture,
    ) -> None:
        self.forward = forward
        self.capture = capture
        self.kv_cache = kv_cache
        self.shape = shape
        self.use_graphs = use_graphs
        self.buckets = round_buckets(shape.max_num_seqs)
        device = self.device = kv_cache.device
        pin = device.type == "cuda"
        rows, width = shape.max_num_seqs, shape.max_blocks_per_seq
        self._host_fields = torch.zeros(NUM_FIELDS, rows, dtype=torch.int32, pin_memory=pin)
        self._host_tables = torch.zeros(rows, width, dtype=torch.int32, pin_memory=pin)
        self._host_tokens = torch.zeros(shape.max_steps, rows, dtype=torch.int64, pin_memory=pin)
        self._host_logprobs = torch.zeros(shape.max_steps, rows, dtype=torch.float32, pin_memory=pin)
        self._fields = torch.zeros(NUM_FIELDS, rows, dtype=torch.int32, device=device)
        self._tables = torch.zeros(rows, width, dtype=torch.int32, device=device)
        self._tokens = torch.zeros(shape.max_steps, rows, dtype=torch.int64, device=device)
        self._logprobs = torch.zeros(shape.max_steps, rows, dtype=torch.float32, device=device)
        self._table_rows = _TableRows(self._host_tables.numpy())
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph | None] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_graphs else None

    def run(self, seqs: list[Sequence], num_steps: int) -> RoundResult:
        """`num_steps` decode steps of every sequence in `seqs` (blocks for them already allocated)."""
        if not 1 <= num_steps <= self.shape.max_steps:
            raise ValueError(f"a round runs 1..{self.shape.max_steps} steps, not {num_steps}")
        rows = self._table_rows.assign(seqs)
        bucket = _bucket(len(self._table_rows.seqs), self.buckets)
        self._fill_fields(bucket)
        self._fields.copy_(self._host_fields, non_blocking=True)
        self._tables[:bucket].copy_(self._host_tables[:bucket], non_blocking=True)
        self._replay(bucket, num_steps)
        self._host_tokens[:num_steps].copy_(self._tokens[:num_steps], non_blocking=True)
        self._host_logprobs[:num_steps].copy_(self._logprobs[:num_steps], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        count = len(self._table_rows.seqs)
        tokens = self._host_tokens[:num_steps, :count].numpy().T.tolist()
        logprobs = self._host_logprobs[:num_steps, :count].numpy().T.tolist()
        if rows == list(range(count)):
            return RoundResult(tokens, logprobs)
        return RoundResult([tokens[row] for row in rows], [logprobs[row] for row in rows])

    def capture_all(self) -> int:
        """Capture the round of every batch bucket now, at full length and as the single step a round falls
        back to under KV pressure; returns how many graphs there are. Only padding rows run (no blocks,
        position 0): they write the scratch block, never a sequence's KV."""
        if not self.use_graphs:
            return 0
        self._host_fields.zero_()
        self._fields.zero_()
        for num_steps in sorted({self.shape.max_steps, 1}, reverse=True):
            for bucket in self.buckets:
                self._replay(bucket, num_steps)
        torch.cuda.current_stream().synchronize()
        return sum(graph is not None for graph in self._graphs.values())

    def capture_next(self) -> bool:
        """Capture the full-length round of the largest batch bucket that has none yet (from padding rows, as
        ``capture_all``); whether there was one to capture."""
        if not self.use_graphs:
            return False
        missing = [b for b in reversed(self.buckets) if (b, self.shape.max_steps) not in self._graphs]
        if not missing:
            return False
        self._host_fields.zero_()
        self._fields.zero_()
        self._replay(missing[0], self.shape.max_steps)
        torch.cuda.current_stream().synchronize()
        return True

    def _fill_fields(self, bucket: int) -> None:
        seqs = self._table_rows.seqs
        count = len(seqs)
        fields = self._host_fields.numpy()
        fields[:, count:bucket] = 0  # padding rows: no blocks, position 0
        fields[TOKEN, :count] = [seq.token_ids[-1] for seq in seqs]
        fields[POSITION, :count] = [len(seq.token_ids) - 1 for seq in seqs]
        fields[NUM_BLOCKS, :count] = [len(seq.block_table) for seq in seqs]
        seeds = np.array([seq.sampling_seed for seq in seqs], dtype=np.uint64).view(np.int32).reshape(count, 2)
        fields[SEED_LOW : SEED_HIGH + 1, :count] = seeds.T  # little-endian: low word first
        temperatures = np.array([seq.params.temperature for seq in seqs], dtype=np.float32)
        fields[TEMPERATURE, :count] = temperatures.view(np.int32)

    def _replay(self, bucket: int, num_steps: int) -> None:
        key = (bucket, num_steps)
        if key not in self._graphs:
            self._graphs[key] = self._capture(bucket, num_steps) if self.use_graphs else None
        graph = self._graphs[key]
        if graph is None:
            self._steps(bucket, num_steps)
        else:
            graph.replay()

    def _steps(self, bucket: int, num_steps: int) -> None:
        """The round's device work (what a graph captures): outputs land in self._tokens / self._logprobs."""
        kernels, shape, num_heads = self.forward.kernels, self.shape, self.forward.num_heads
        fields, tables = self._fields[:, :bucket], self._tables[:bucket]
        temperatures = fields[TEMPERATURE].view(torch.float32)
        geometry = (shape.block_size, shape.scratch_block, shape.max_model_len)
        input_ids = fields[TOKEN]
        for step in range(num_steps):
            positions, slots, seq_lens = kernels.decode_slots(fields[POSITION], step, tables, fields[NUM_BLOCKS],
                                                              geometry)  # fmt: skip

            def attend(qkv: torch.Tensor, cache: torch.Tensor, seq_lens: torch.Tensor = seq_lens) -> torch.Tensor:
                return kernels.decode_attention(qkv, cache, tables, seq_lens, num_heads)

            normed = self.forward.final_hidden(input_ids, positions, slots, self.kv_cache, attend)
            tokens, logprobs = self._tokens[step, :bucket], self._logprobs[step, :bucket]
            kernels.sample(self.forward.logits(normed), temperatures, fields[SEED_LOW : SEED_HIGH + 1], positions + 1,
                           tokens, logprobs)  # fmt: skip
            input_ids = tokens

    def _capture(self, bucket: int, num_steps: int) -> torch.cuda.CUDAGraph | None:
        started = time.perf_counter()
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up outside the graph: kernel compilation, allocator, library handles
                    self._steps(bucket, num_steps)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with self.capture(graph, self._pool):
                self._steps(bucket, num_steps)
        except RuntimeError as error:  # keep serving eagerly rather than die on a capture problem
            log.warning("decode_round_capture_failed", batch=bucket, steps=num_steps, error=str(error))
            self.use_graphs = False
            return None
        seconds = round(time.perf_counter() - started, 3)
        log.debug("decode_round_captured", batch=bucket, steps=num_steps, seconds=seconds)
        return graph


class _TableRows:
    """Stable rows of the host block-table buffer: a sequence keeps its row while it keeps decoding.

    A sequence that leaves has its row taken by the last one (rows stay 0..n-1); a row is rewritten
    only from the first block that changed since the last round.
    """

    def __init__(self, tables: np.ndarray) -> None:
        self.tables = tables
        self.seqs: list[Sequence] = []
        self._row_of: dict[Sequence, int] = {}
        self._written = [0] * tables.shape[0]  # blocks of each row already in `tables`
        self._preemptions = [0] * tables.shape[0]  # the row's sequence's preemption count when written

    def assign(self, seqs: list[Sequence]) -> list[int]:
        """Rows of `seqs` (in their order) after dropping every other sequence; tables brought up to date."""
        if len(seqs) == len(self.seqs) and all(map(operator.is_, seqs, self.seqs)):
            rows: Iterable[int] = range(len(seqs))  # most rounds: the same sequences in the same order
        else:
            rows = self._reassign(seqs)
        for seq, row in zip(seqs, rows, strict=True):
            table, written = seq.block_table, self._written[row]
            if self._preemptions[row] != seq.num_preemptions:  # preempted and back: new blocks
                written, self._preemptions[row] = 0, seq.num_preemptions
            if written != len(table):
                self.tables[row, written : len(table)] = table[written:]
                self._written[row] = len(table)
        return list(rows)

    def _reassign(self, seqs: list[Sequence]) -> list[int]:
        members = set(seqs)
        for row in reversed(range(len(self.seqs))):
            if self.seqs[row] not in members:
                self._drop(row)
        for seq in seqs:
            if seq not in self._row_of:
                self._row_of[seq] = len(self.seqs)
                self._written[len(self.seqs)] = 0
                self._preemptions[len(self.seqs)] = seq.num_preemptions
                self.seqs.append(seq)
        return [self._row_of[seq] for seq in seqs]

    def _drop(self, row: int) -> None:
        last = len(self.seqs) - 1
        del self._row_of[self.seqs[row]]
        if row != last:
            moved = self.seqs[last]
            count = self._written[last]
            self.tables[row, :count] = self.tables[last, :count]
            self._written[row] = count
            self._preemptions[row] = self._preemptions[last]
            self.seqs[row] = moved
            self._row_of[moved] = row
        self.seqs.pop()


def _bucket(value: int, sizes: list[int]) -> int:
    for size in sizes:
        if size >= value:
            return size
    raise ValueError(f"{value} sequences exceed the largest decode batch {sizes[-1]}")
