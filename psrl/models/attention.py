"""Paged attention in plain torch: write new keys/values into the block cache, gather, run SDPA.

One layer's cache is a tensor [num_blocks, block_size, 2, num_kv_heads, head_dim] (keys and values
of a position side by side, so one copy writes both). Gathering whole blocks, not single slots,
keeps the copy at memcpy speed, and keys/values reach SDPA as strided views of that one gather.
Grouped-query attention uses SDPA's `enable_gqa`, so key/value heads are never repeated in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional

from psrl.kernels.packed import PackedPrefill


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
    # decode from a dense per-sequence copy of the cache (see psrl.engine.decode_workspace):
    # [B] flat index (row * capacity + position) each new token is written to; keys are read from
    # the first num_key_slots positions of rows 0..B-1
    dense_write_index: torch.Tensor | None = None


def prefill_attention_batch(prefill: PackedPrefill, block_size: int) -> AttentionBatch:
    """The padded-SDPA description of a packed prefill (causal mask over each sequence's cached context)."""
    tables = prefill.block_tables
    num_seqs, num_key_slots = tables.shape[0], tables.shape[1] * block_size
    max_query_len = max(prefill.query_lens_list)
    device = tables.device
    query_positions = prefill.context_starts.unsqueeze(1) + torch.arange(max_query_len, device=device).unsqueeze(0)
    key_index = torch.arange(num_key_slots, device=device)
    mask = key_index.view(1, 1, -1) <= query_positions.unsqueeze(2)
    return AttentionBatch(
        slot_mapping=prefill.slot_mapping,
        block_tables=tables.reshape(-1),
        mask=mask.unsqueeze(1),
        num_seqs=num_seqs,
        max_query_len=max_query_len,
        num_key_slots=num_key_slots,
        query_pad_index=prefill.seq_index * max_query_len + prefill.offset_in_seq,
    )


def paged_attention(
    q: torch.Tensor,
    new_kv: torch.Tensor,
    cache: torch.Tensor,
    batch: AttentionBatch,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [N, Hq, D] and new_kv [N, 2, Hkv, D] (rotated keys, values) -> attention output [N, Hq * D].

    `dense`: this layer's [rows, capacity, 2, Hkv, D] decode workspace, used with dense_write_index.
    """
    num_kv_heads, head_dim = cache.shape[3], cache.shape[4]
    cache.view(-1, 2, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, new_kv)
    if dense is not None and batch.dense_write_index is not None:
        dense.view(-1, 2, num_kv_heads, head_dim).index_copy_(0, batch.dense_write_index, new_kv)
    return attend(q, cache, batch, dense)


def attend(
    q: torch.Tensor, cache: torch.Tensor, batch: AttentionBatch, dense: torch.Tensor | None = None
) -> torch.Tensor:
    """Attention of q [N, Hq, D] over keys/values already in the cache (or the dense workspace) -> [N, Hq * D]."""
    num_kv_heads, head_dim = cache.shape[3], cache.shape[4]
    if dense is not None and batch.dense_write_index is not None:
        gathered = dense[: batch.num_seqs, : batch.num_key_slots]
    else:
        gathered = cache.index_select(0, batch.block_tables)
        gathered = gathered.view(batch.num_seqs, batch.num_key_slots, 2, num_kv_heads, head_dim)
    keys = gathered[:, :, 0].transpose(1, 2)
    values = gathered[:, :, 1].transpose(1, 2)
    if batch.query_pad_index is None:
        # decode: the query heads sharing a key/value head act as that head's query rows (faster than enable_gqa)
        query = q.view(batch.num_seqs, num_kv_heads, q.shape[1] // num_kv_heads, head_dim)
        out = functional.scaled_dot_product_attention(query, keys, values, attn_mask=batch.mask)
        return out.reshape(batch.num_seqs, q.shape[1] * head_dim)
    query = _pad_queries(q, batch)
    out = functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=batch.mask, enable_gqa=query.shape[1] != num_kv_heads
    )
    out = out.transpose(1, 2).reshape(batch.num_seqs * batch.max_query_len, q.shape[1] * head_dim)
    return out.index_select(0, batch.query_pad_index)


def _pad_queries(q: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
    """[B, Hq, max_query_len, D] from packed queries (prefill)."""
    if batch.query_pad_index is None:
        raise ValueError("decode batches are not padded")
    padded = q.new_zeros(batch.num_seqs * batch.max_query_len, q.shape[1], q.shape[2])
    padded.index_copy_(0, batch.query_pad_index, q)
    return padded.view(batch.num_seqs, batch.max_query_len, q.shape[1], q.shape[2]).transpose(1, 2)
