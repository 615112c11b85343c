"""Paged decode attention in Triton: one program per (sequence, kv head, split) with all its query heads.

Each program reads its share of one kv head's keys and values exactly once, block by block through
the block table, for every query head of the group at once (grouped-query attention: the group is
the row dimension of the two matrix products, padded to 16). Long contexts are split across
programs (split-K, as in FlashDecoding): each split keeps an unnormalised partial result with its
running max and sum, and a second kernel merges the splits. The number of splits is fixed per batch
size (so a CUDA graph captures one launch shape) and each sequence uses as many of them as its length
warrants, at least `MIN_SPLIT_TOKENS` keys each.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 32
BLOCK_N = 64
LOG2_E = 1.4426950408889634


@triton.jit
def _decode_attention_kernel(
    qkv, cache, tables, seq_lens, out, partial_acc, partial_stats,
    qkv_stride, table_stride, block_size, scale_log2,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr, MIN_SPLIT: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(seq_lens + seq)
    num_splits = tl.maximum(tl.minimum(SPLITS, tl.cdiv(length, MIN_SPLIT)), 1)
    per_split = tl.cdiv(tl.cdiv(length, num_splits), BLOCK) * BLOCK
    start = split * per_split
    end = tl.minimum(start + per_split, length)
    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + group
    q = tl.load(qkv + seq * qkv_stride + heads[:, None] * HEAD_DIM + dims[None, :], mask=(group < GROUP)[:, None],
                other=0.0)  # fmt: skip
    running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    slot_stride = 2 * NUM_KV_HEADS * HEAD_DIM
    for first in range(start, end, BLOCK):
        tokens = first + tl.arange(0, BLOCK)
        valid = tokens < end
        block = tl.load(tables + seq * table_stride + tokens // block_size, mask=valid, other=0).to(tl.int64)
        base = cache + (block * block_size + tokens % block_size) * slot_stride + kv_head * HEAD_DIM
        keys = tl.load(base[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        values = tl.load(base[:, None] + NUM_KV_HEADS * HEAD_DIM + dims[None, :], mask=valid[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(keys), input_precision=PRECISION) * scale_log2
        scores = tl.where(valid[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        correction = tl.exp2(running_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        running_sum = running_sum * correction + tl.sum(probs, 1)
        acc = acc * correction[:, None] + tl.dot(probs.to(values.dtype), values, input_precision=PRECISION)
        running_max = new_max
    if SPLITS == 1:
        result = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
        out_rows = out + seq * (GROUP * NUM_KV_HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + dims[None, :]
        tl.store(out_rows, result.to(out.dtype.element_ty), mask=(group < GROUP)[:, None])
    else:
        part = (seq * NUM_KV_HEADS + kv_head) * SPLITS + split
        tl.store(partial_acc + (part * GROUP_PAD + group[:, None]) * HEAD_DIM + dims[None, :], acc)
        tl.store(partial_stats + (part * 2) * GROUP_PAD + group, running_max)
        tl.store(partial_stats + (part * 2 + 1) * GROUP_PAD + group, running_sum)


@triton.jit
def _merge_splits_kernel(
    partial_acc, partial_stats, out,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    first_part = (seq * NUM_KV_HEADS + kv_head) * SPLITS
    overall_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    for split in range(SPLITS):
        split_max = tl.load(partial_stats + ((first_part + split) * 2) * GROUP_PAD + group)
        overall_max = tl.maximum(overall_max, split_max)
    overall_max = tl.where(overall_max == float("-inf"), 0.0, overall_max)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for split in range(SPLITS):
        part = first_part + split
        weight = tl.exp2(tl.load(partial_stats + (part * 2) * GROUP_PAD + group) - overall_max)
        total += weight * tl.load(partial_stats + (part * 2 + 1) * GROUP_PAD + group)
        acc += weight[:, None] * tl.load(partial_acc + (part * GROUP_PAD + group[:, None]) * HEAD_DIM + dims[None, :])
    result = acc / tl.where(total > 0, total, 1.0)[:, None]
    heads = kv_head * GROUP + group
    out_rows = out + seq * (GROUP * NUM_KV_HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + dims[None, :]
    tl.store(out_rows, result.to(out.dtype.element_ty), mask=(group < GROUP)[:, None])


def num_splits(num_seqs: int, num_kv_heads: int, num_sms: int) -> int:
    """Splits per (sequence, kv head): enough programs for about four per multiprocessor."""
    return max(1, min(MAX_SPLITS, math.ceil(4 * num_sms / (num_seqs * num_kv_heads))))


def decode_attention(
    qkv: torch.Tensor,
    cache: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_heads: int,
    splits: int,
) -> torch.Tensor:
    """One query token per sequence: q in qkv [B, (Hq + 2 Hkv) D], keys of positions < seq_lens -> [B, Hq * D]."""
    batch = qkv.shape[0]
    num_kv_heads, head_dim, block_size = cache.shape[3], cache.shape[4], cache.shape[1]
    group = num_heads // num_kv_heads
    group_pad = max(16, triton.next_power_of_2(group))
    out = torch.empty(batch, num_heads * head_dim, dtype=qkv.dtype, device=qkv.device)
    partial_acc = partial_stats = out
    if splits > 1:
        partial_acc = torch.empty(batch * num_kv_heads * splits * group_pad * head_dim, dtype=torch.float32,
                                  device=qkv.device)  # fmt: skip
        partial_stats = torch.empty(batch * num_kv_heads * splits * 2 * group_pad, dtype=torch.float32,
                                    device=qkv.device)  # fmt: skip
    constants = dict(GROUP=group, GROUP_PAD=group_pad, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, SPLITS=splits)
    _decode_attention_kernel[(batch, num_kv_heads, splits)](
        qkv, cache, tables, seq_lens, out, partial_acc, partial_stats,
        qkv.stride(0), tables.stride(0), block_size, LOG2_E / math.sqrt(head_dim),
        MIN_SPLIT=MIN_SPLIT_TOKENS, BLOCK=BLOCK_N, PRECISION=_precision(qkv.dtype), num_warps=4, num_stages=2,
        **constants,
    )  # fmt: skip
    if splits > 1:
        _merge_splits_kernel[(batch, num_kv_heads)](partial_acc, partial_stats, out, num_warps=4, **constants)
    return out


def _precision(dtype: torch.dtype) -> str:
    # fp32 runs must match the eager path to 1e-4: no tf32 in the products
    return "ieee" if dtype == torch.float32 else "tf32"
