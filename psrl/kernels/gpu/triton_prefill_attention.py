"""Causal prefill attention over packed sequences (varlen) and the paged cache, in Triton.

The new tokens of all sequences are packed back to back; their keys and values are already in the
cache (written by the rotary kernel), next to those of earlier chunks and prefix-cache hits, so a
query tile attends to positions [0, its own position] of its sequence through the block table.
One program per (tile of up to BLOCK_M query tokens of one sequence, query head); the tiles are
listed on the host, so no program is spent on padding.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from psrl.kernels.gpu.triton_decode_attention import LOG2_E, _precision

BLOCK_M = 64
BLOCK_N = 64


@triton.jit
def _prefill_attention_kernel(
    qkv, cache, tables, tile_seqs, tile_starts, query_starts, query_lens, context_starts, out,
    qkv_stride, table_stride, out_stride, block_size, scale_log2,
    GROUP: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    seq = tl.load(tile_seqs + tile).to(tl.int64)
    first_query = tl.load(tile_starts + tile)
    query_len = tl.load(query_lens + seq)
    row0 = tl.load(query_starts + seq).to(tl.int64)
    context = tl.load(context_starts + seq)
    offsets = first_query + tl.arange(0, BLOCK_Q)
    is_query = offsets < query_len
    rows = row0 + offsets
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(qkv + rows[:, None] * qkv_stride + head * HEAD_DIM + dims[None, :], mask=is_query[:, None], other=0.0)
    query_positions = context + offsets
    end = tl.minimum(context + first_query + BLOCK_Q, context + query_len)
    running_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_DIM], tl.float32)
    slot_stride = 2 * NUM_KV_HEADS * HEAD_DIM
    for first in range(0, end, BLOCK_K):
        keys_at = first + tl.arange(0, BLOCK_K)
        valid = keys_at < end
        block = tl.load(tables + seq * table_stride + keys_at // block_size, mask=valid, other=0).to(tl.int64)
        base = cache + (block * block_size + keys_at % block_size) * slot_stride + kv_head * HEAD_DIM
        keys = tl.load(base[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        values = tl.load(base[:, None] + NUM_KV_HEADS * HEAD_DIM + dims[None, :], mask=valid[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(keys), input_precision=PRECISION) * scale_log2
        allowed = valid[None, :] & (keys_at[None, :] <= query_positions[:, None])
        scores = tl.where(allowed, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        correction = tl.exp2(running_max - safe_max)
        probs = tl.exp2(scores - safe_max[:, None])
        running_sum = running_sum * correction + tl.sum(probs, 1)
        acc = acc * correction[:, None] + tl.dot(probs.to(values.dtype), values, input_precision=PRECISION)
        running_max = new_max
    result = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
    out_rows = out + rows[:, None] * out_stride + head * HEAD_DIM + dims[None, :]
    tl.store(out_rows, result.to(out.dtype.element_ty), mask=is_query[:, None])


def prefill_tiles(query_lens: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, first query offset) of every BLOCK_M-token query tile, as two int32 tensors."""
    seqs: list[int] = []
    starts: list[int] = []
    for seq, length in enumerate(query_lens):
        for start in range(0, length, BLOCK_M):
            seqs.append(seq)
            starts.append(start)
    packed = torch.tensor(seqs + starts, dtype=torch.int32).to(device, non_blocking=True)
    return packed[: len(seqs)], packed[len(seqs) :]


def prefill_attention(
    qkv: torch.Tensor,
    cache: torch.Tensor,
    tables: torch.Tensor,
    query_starts: torch.Tensor,
    query_lens: torch.Tensor,
    context_starts: torch.Tensor,
    tiles: tuple[torch.Tensor, torch.Tensor],
    num_heads: int,
) -> torch.Tensor:
    """Causal attention of the packed new tokens (q in qkv [N, (Hq + 2 Hkv) D]) -> [N, Hq * D]."""
    num_kv_heads, head_dim, block_size = cache.shape[3], cache.shape[4], cache.shape[1]
    out = torch.empty(qkv.shape[0], num_heads * head_dim, dtype=qkv.dtype, device=qkv.device)
    tile_seqs, tile_starts = tiles
    _prefill_attention_kernel[(tile_seqs.shape[0], num_heads)](
        qkv, cache, tables, tile_seqs, tile_starts, query_starts, query_lens, context_starts, out,
        qkv.stride(0), tables.stride(0), out.stride(0), block_size, LOG2_E / math.sqrt(head_dim),
        GROUP=num_heads // num_kv_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_Q=BLOCK_M, BLOCK_K=BLOCK_N, PRECISION=_precision(qkv.dtype), num_warps=4, num_stages=2,
    )  # fmt: skip
    return out
