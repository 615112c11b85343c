"""Execution: owns the model and the KV cache, turns a scheduled batch into tensors and logits."""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass

import torch

from psrl.engine.decode_graphs import DecodeGraphRunner
from psrl.engine.decode_rounds import DecodeRounds, RoundResult, RoundShape
from psrl.engine.decode_workspace import DecodeWorkspace, HeadMajorDecodeWorkspace
from psrl.engine.scheduler import ScheduledBatch
from psrl.engine.sequence import Sequence
from psrl.kernels.cpu_decode import CpuDecodeKernels
from psrl.kernels.gpu.step import StepKernels
from psrl.kernels.packed import PackedPrefill
from psrl.models.attention import AttentionBatch, prefill_attention_batch
from psrl.models.fused_decode import FusedCpuDecoder
from psrl.models.kernel_forward import KernelForward
from psrl.models.llama import DecoderModel
from psrl.tms import ROLLOUT, SideMemory


@dataclass(frozen=True, slots=True)
class RunnerShape:
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_model_len: int


class ModelRunner:
    def __init__(
        self,
        model: DecoderModel,
        shape: RunnerShape,
        dtype: torch.dtype,
        *,
        cuda_graphs: bool = True,
        bucketed_decode: bool = False,
        dense_decode: bool = True,
        cpu_library: ctypes.CDLL | None = None,
        step_kernels: StepKernels | None = None,
        decode_steps: int = 1,
        memory: SideMemory | None = None,
    ) -> None:
        """`cpu_library`: the CPU kernels (psrl.kernels.library); fp32 CPU decode steps run fused with them.

        `step_kernels` (psrl.kernels.gpu): prefill and decode rounds of `decode_steps` steps run through them
        (raises StepKernelsUnavailableError for a model they do not cover).
        `memory`: the KV cache and captured graphs go to its regions (``psrl.tms``); default resident.
        """
        memory = memory or SideMemory.unmanaged(ROLLOUT)
        spec, device = model.spec, model.embed_tokens.weight.device
        self.model = model
        self.block_size = shape.block_size
        self.device = device
        # one block more than the block manager knows of: the scratch block of padded decode rows
        with memory.region("kv_cache"):
            self.kv_cache = torch.zeros(
                spec.num_layers, shape.num_blocks + 1, shape.block_size, 2, spec.num_kv_heads, spec.head_dim,
                dtype=dtype, device=device,
            )  # fmt: skip
        use_graphs = cuda_graphs and device.type == "cuda"
        max_blocks_per_seq = (shape.max_model_len + shape.block_size - 1) // shape.block_size
        self.kernel_forward: KernelForward | None = None
        self.rounds: DecodeRounds | None = None
        if step_kernels is not None:
            self.kernel_forward = KernelForward(model, step_kernels)
            round_shape = RoundShape(shape.block_size, shape.num_blocks, shape.max_num_seqs, max_blocks_per_seq,
                                     shape.max_model_len, decode_steps)  # fmt: skip
            self.rounds = DecodeRounds(
                self.kernel_forward, self.kv_cache, round_shape, use_graphs, memory.graph_capture
            )
        self.decode_graphs = None
        if use_graphs or bucketed_decode:
            self.decode_graphs = DecodeGraphRunner(
                model, self.kv_cache, shape.block_size, shape.num_blocks, shape.max_num_seqs, max_blocks_per_seq,
                use_graphs, memory.graph_capture,
            )  # fmt: skip
        self.workspace: DecodeWorkspace | None = None
        self.fused: FusedCpuDecoder | None = None
        self.fused_workspace: HeadMajorDecodeWorkspace | None = None
        if self.decode_graphs is None and dense_decode:
            workspace_shape = (self.kv_cache, shape.block_size, shape.max_num_seqs, shape.max_model_len)
            if cpu_library is not None and device.type == "cpu" and dtype == torch.float32:
                self.fused = FusedCpuDecoder(model, CpuDecodeKernels(cpu_library))
            if self.fused is not None:
                self.fused_workspace = HeadMajorDecodeWorkspace(*workspace_shape)
            else:
                self.workspace = DecodeWorkspace(*workspace_shape)

    @property
    def decode_path(self) -> str:
        """How decode steps run: <kernels>_graph_rounds or <kernels>_rounds (step kernels, several steps per
        round), else cuda_graphs, bucketed, fused_cpu (kernels), dense (eager torch) or gather."""
        if self.rounds is not None:
            kind = self.rounds.forward.kernels.name
            return f"{kind}_graph_rounds" if self.rounds.use_graphs else f"{kind}_rounds"
        if self.decode_graphs is not None:
            return "cuda_graphs" if self.decode_graphs.use_graphs else "bucketed"
        return "fused_cpu" if self.fused is not None else "dense" if self.workspace is not None else "gather"

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        """Run one step; returns fp32 logits for the sequences that now need a token, and those sequences."""
        if not batch.is_prefill and self.decode_graphs is not None:
            return self.decode_graphs.run(batch.seqs), batch.seqs
        if not batch.is_prefill and self.fused is not None:
            return self._fused_decode(batch.seqs)
        if batch.is_prefill and self.kernel_forward is not None:
            return self._kernel_prefill(batch)
        dense_kv = None
        if batch.is_prefill:
            input_ids, positions, prefill, logits_rows, sampled = self._pack_prefill(batch)
            attention = prefill_attention_batch(prefill, self.block_size)
        else:
            sampled, capacity = batch.seqs, None
            if self.workspace is not None:
                sampled, dense_kv = self.workspace.sync(batch.seqs), self.workspace.buffer
                capacity = dense_kv.shape[2]
            input_ids, positions, attention = self._prepare_decode(sampled, capacity)
            logits_rows = None
        hidden = self.model(input_ids, positions, self.kv_cache, attention, dense_kv)
        if logits_rows is not None:
            hidden = hidden.index_select(0, logits_rows)
        return self.model.compute_logits(hidden), sampled

    def run_round(self, seqs: list[Sequence], num_steps: int) -> RoundResult:
        """`num_steps` decode steps of every sequence, sampled on the device (plain sampling only)."""
        if self.rounds is None:
            raise RuntimeError("decode rounds need step kernels")
        with torch.inference_mode():
            return self.rounds.run(seqs, num_steps)

    def _kernel_prefill(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        forward = self.kernel_forward
        if forward is None:
            raise RuntimeError("kernel prefill needs step kernels")
        input_ids, positions, prefill, logits_rows, sampled = self._pack_prefill(batch)

        def attend(qkv: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
            return forward.kernels.prefill_attention(qkv, cache, prefill, forward.num_heads)

        normed = forward.final_hidden(input_ids, positions, prefill.slot_mapping, self.kv_cache, attend)
        return forward.logits(normed.index_select(0, logits_rows)).float(), sampled

    def _fused_decode(self, scheduled: list[Sequence]) -> tuple[torch.Tensor, list[Sequence]]:
        if self.fused is None or self.fused_workspace is None:
            raise RuntimeError("the fused CPU decoder is not set up")
        workspace, block_size = self.fused_workspace, self.block_size
        seqs = workspace.sync(scheduled)
        positions = [seq.num_tokens - 1 for seq in seqs]
        slots = [
            seq.block_table[p // block_size] * block_size + p % block_size
            for seq, p in zip(seqs, positions, strict=True)
        ]
        packed = torch.tensor([seq.token_ids[-1] for seq in seqs] + positions + slots, dtype=torch.int64)
        return self.fused.logits(packed, self.kv_cache, workspace.keys, workspace.values), seqs

    def _prepare_decode(
        self, seqs: list[Sequence], dense_capacity: int | None
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        """Decode inputs; keys come from the dense workspace when `dense_capacity` is given, else from blocks."""
        block_size, device = self.block_size, self.device
        positions = [seq.num_tokens - 1 for seq in seqs]
        slots = [
            seq.block_table[p // block_size] * block_size + p % block_size
            for seq, p in zip(seqs, positions, strict=True)
        ]
        if dense_capacity is None:
            num_blocks_per_seq = max(len(seq.block_table) for seq in seqs)
            tables = [seq.block_table + [0] * (num_blocks_per_seq - len(seq.block_table)) for seq in seqs]
            block_tables = torch.tensor(tables, device=device).view(-1)
            num_key_slots, dense_write_index = num_blocks_per_seq * block_size, None
        else:
            block_tables = torch.empty(0, dtype=torch.long, device=device)
            num_key_slots = max(positions) + 1
            dense_write_index = torch.tensor(
                [row * dense_capacity + p for row, p in enumerate(positions)], device=device
            )
        positions_t = torch.tensor(positions, device=device)
        key_index = torch.arange(num_key_slots, device=device)
        attention = AttentionBatch(
            slot_mapping=torch.tensor(slots, device=device),
            block_tables=block_tables,
            mask=(key_index.unsqueeze(0) <= positions_t.unsqueeze(1)).view(len(seqs), 1, 1, num_key_slots),
            num_seqs=len(seqs),
            max_query_len=1,
            num_key_slots=num_key_slots,
            query_pad_index=None,
            dense_write_index=dense_write_index,
        )
        input_ids = torch.tensor([seq.token_ids[-1] for seq in seqs], device=device)
        return input_ids, positions_t, attention

    def _pack_prefill(
        self, batch: ScheduledBatch
    ) -> tuple[torch.Tensor, torch.Tensor, PackedPrefill, torch.Tensor, list[Sequence]]:
        """(input ids, positions, the packed description, rows whose logits are needed, their sequences)."""
        device, block_size = self.device, self.block_size
        seqs, num_new = batch.seqs, batch.num_new_tokens
        starts = [seq.num_computed_tokens for seq in seqs]
        ends = [start + n for start, n in zip(starts, num_new, strict=True)]
        input_ids: list[int] = []
        for seq, start, end in zip(seqs, starts, ends, strict=True):
            input_ids.extend(seq.token_ids[start:end])
        num_blocks_per_seq = max((end + block_size - 1) // block_size for end in ends)
        tables = [seq.block_table[:num_blocks_per_seq] for seq in seqs]
        tables = [table + [0] * (num_blocks_per_seq - len(table)) for table in tables]
        row_ends = list(itertools.accumulate(num_new))
        packed = torch.tensor(
            [*starts, *num_new, *(end - n for end, n in zip(row_ends, num_new, strict=True)), *input_ids],
            dtype=torch.int64,
        ).to(device, non_blocking=True)
        num_seqs = len(seqs)
        starts_t, num_tokens_t, query_starts = packed[: 3 * num_seqs].view(3, num_seqs)
        table_tensor = torch.tensor(tables, device=device)
        seq_index = torch.repeat_interleave(torch.arange(num_seqs, device=device), num_tokens_t,
                                            output_size=len(input_ids))  # fmt: skip
        offset_in_seq = torch.arange(len(input_ids), device=device) - query_starts[seq_index]
        positions = starts_t[seq_index] + offset_in_seq
        slots = table_tensor[seq_index, positions // block_size] * block_size + positions % block_size
        prefill = PackedPrefill(
            block_tables=table_tensor,
            context_starts=starts_t,
            query_starts=query_starts,
            query_lens=num_tokens_t,
            query_lens_list=list(num_new),
            seq_index=seq_index,
            offset_in_seq=offset_in_seq,
            slot_mapping=slots,
        )
        finishing = [i for i, (seq, end) in enumerate(zip(seqs, ends, strict=True)) if end == seq.num_tokens]
        last_rows = torch.tensor([row_ends[i] - 1 for i in finishing], device=device, dtype=torch.long)
        return packed[3 * num_seqs :], positions, prefill, last_rows, [seqs[i] for i in finishing]
