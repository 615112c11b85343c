"""Rotary embedding fused with the KV-cache write, and the per-step slot computation of decode rounds, in Triton.

The q/k projections store each head's rotary pairs interleaved (psrl.models.weights), so a pair is
two neighbouring elements and its rotation one complex multiply by the (cos, sin) of its position.
Queries are rotated in place inside the qkv rows; keys are rotated straight into the cache slot,
values copied beside them. One program handles one token, every head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kv_kernel(
    qkv, rope, positions, slots, cache, qkv_stride,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    PAIRS_BLOCK: tl.constexpr, V_BLOCK: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions + token).to(tl.int64)
    slot = tl.load(slots + token).to(tl.int64)
    head_dim: tl.constexpr = 2 * HALF
    dtype = qkv.dtype.element_ty
    row = qkv + token * qkv_stride
    pairs = tl.arange(0, PAIRS_BLOCK)
    mask = pairs < (NUM_HEADS + NUM_KV_HEADS) * HALF
    frequency = pairs % HALF
    cos = tl.load(rope + position * head_dim + 2 * frequency, mask=mask, other=0.0)
    sin = tl.load(rope + position * head_dim + 2 * frequency + 1, mask=mask, other=0.0)
    real = tl.load(row + 2 * pairs, mask=mask, other=0.0).to(tl.float32)
    imaginary = tl.load(row + 2 * pairs + 1, mask=mask, other=0.0).to(tl.float32)
    rotated_real = (real * cos - imaginary * sin).to(dtype)
    rotated_imaginary = (real * sin + imaginary * cos).to(dtype)
    head = pairs // HALF
    is_query = mask & (head < NUM_HEADS)
    tl.store(row + 2 * pairs, rotated_real, mask=is_query)
    tl.store(row + 2 * pairs + 1, rotated_imaginary, mask=is_query)
    slot_base = cache + slot * (2 * NUM_KV_HEADS * head_dim)
    is_key = mask & (head >= NUM_HEADS)
    key_offset = (head - NUM_HEADS) * head_dim + 2 * frequency
    tl.store(slot_base + key_offset, rotated_real, mask=is_key)
    tl.store(slot_base + key_offset + 1, rotated_imaginary, mask=is_key)
    columns = tl.arange(0, V_BLOCK)
    v_mask = columns < NUM_KV_HEADS * head_dim
    values = tl.load(row + (NUM_HEADS + NUM_KV_HEADS) * head_dim + columns, mask=v_mask, other=0.0)
    tl.store(slot_base + NUM_KV_HEADS * head_dim + columns, values, mask=v_mask)


@triton.jit
def _decode_slots_kernel(
    positions, tables, num_blocks, step_positions, slots, seq_lens,
    num_rows, step, table_stride, block_size, scratch_block, max_position, BLOCK: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < num_rows
    position = tl.load(positions + rows, mask=mask, other=0).to(tl.int64) + step
    blocks = tl.load(num_blocks + rows, mask=mask, other=0).to(tl.int64)
    index = position // block_size
    owned = mask & (index < blocks)
    block = tl.load(tables + rows.to(tl.int64) * table_stride + index, mask=owned, other=0).to(tl.int64)
    block = tl.where(owned, block, scratch_block)
    tl.store(slots + rows, block * block_size + position % block_size, mask=mask)
    tl.store(seq_lens + rows, tl.minimum(position + 1, blocks * block_size).to(tl.int32), mask=mask)
    tl.store(step_positions + rows, tl.minimum(position, max_position - 1), mask=mask)


def rotary_kv_write(
    qkv: torch.Tensor,
    rope: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> None:
    """Rotate q (in place) and k of qkv [N, (Hq + 2 Hkv) D]; write k, v into cache [blocks, bs, 2, Hkv, D] at slots."""
    head_dim = cache.shape[-1]
    _rotary_kv_kernel[(qkv.shape[0],)](
        qkv, rope, positions, slots, cache, qkv.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=head_dim // 2,
        PAIRS_BLOCK=triton.next_power_of_2((num_heads + num_kv_heads) * head_dim // 2),
        V_BLOCK=triton.next_power_of_2(num_kv_heads * head_dim), num_warps=4,
    )  # fmt: skip


def decode_slots(
    positions: torch.Tensor,
    step: int,
    tables: torch.Tensor,
    num_blocks: torch.Tensor,
    block_size: int,
    scratch_block: int,
    max_position: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions + step clamped for the rotary table, cache slots, attended lengths) of one decode step."""
    rows = positions.shape[0]
    device = positions.device
    step_positions = torch.empty(rows, dtype=torch.int64, device=device)
    slots = torch.empty(rows, dtype=torch.int64, device=device)
    seq_lens = torch.empty(rows, dtype=torch.int32, device=device)
    block = 128
    _decode_slots_kernel[(triton.cdiv(rows, block),)](
        positions, tables, num_blocks, step_positions, slots, seq_lens,
        rows, step, tables.stride(0), block_size, scratch_block, max_position, BLOCK=block,
    )  # fmt: skip
    return step_positions, slots, seq_lens
