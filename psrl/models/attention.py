"""Paged attention in plain torch: write new keys/values into the block cache, gather, run SDPA.

The cache of one layer is a pair of tensors [num_blocks, block_size, num_kv_heads, head_dim].
Gathering whole blocks (not single slots) keeps the copy at memcpy speed, and the gathered keys are
passed to SDPA as a strided view, so no further copy is made. Grouped-query attention uses SDPA's
`enable_gqa`, so key/value heads are never repeated in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional


@dataclass(slots=True)
class AttentionBatch:
    """Per-step attention metadata, built once by the model runner and shared by all layers.

    Tokens are packed: N tokens from B sequences, each sequence contributing a contiguous run of
    query tokens (one for decode). Keys span each sequence's whole context, padded to
    `num_key_slots` = `num_blocks_per_seq` * block_size.
    """

    slot_mapping: torch.Tensor  # [N] cache slot written by each new token
    block_tables: torch.Tensor  # [B * num_blocks_per_seq] block ids, padded with block 0
    mask: torch.Tensor  # [B, 1, max_query_len, num_key_slots] bool, True = may attend
    num_seqs: int
    max_query_len: int
    num_key_slots: int
    # [N] position of each packed token in the padded [B * max_query_len] layout; None for decode,
    # where every sequence has exactly one query token and packing equals padding
    query_pad_index: torch.Tensor | None


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    batch: AttentionBatch,
) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] (already rotated) -> attention output [N, Hq * D]."""
    num_kv_heads, head_dim = cache_k.shape[2], cache_k.shape[3]
    cache_k.view(-1, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, k)
    cache_v.view(-1, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, v)
    keys = _gather(cache_k, batch)
    values = _gather(cache_v, batch)
    query = _pad_queries(q, batch)
    out = functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=batch.mask, enable_gqa=query.shape[1] != num_kv_heads
    )
    num_heads = q.shape[1]
    out = out.transpose(1, 2).reshape(batch.num_seqs * batch.max_query_len, num_heads * head_dim)
    if batch.query_pad_index is not None:
        out = out.index_select(0, batch.query_pad_index)
    return out


def _gather(cache: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
    """[B, Hkv, num_key_slots, D] strided view over a block-level gather of the cache."""
    blocks = cache.index_select(0, batch.block_tables)
    return blocks.view(batch.num_seqs, batch.num_key_slots, cache.shape[2], cache.shape[3]).transpose(1, 2)


def _pad_queries(q: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
    """[B, Hq, max_query_len, D] from packed queries."""
    if batch.query_pad_index is None:
        return q.view(batch.num_seqs, 1, q.shape[1], q.shape[2]).transpose(1, 2)
    padded = q.new_zeros(batch.num_seqs * batch.max_query_len, q.shape[1], q.shape[2])
    padded.index_copy_(0, batch.query_pad_index, q)
    return padded.view(batch.num_seqs, batch.max_query_len, q.shape[1], q.shape[2]).transpose(1, 2)
