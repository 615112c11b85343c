"""`StepKernels` in torch, built from the model's own functions: the eager path the Triton kernels must match.

It runs on any device (CPU tests of the decode rounds use it) and doubles as the reference in the
kernel tests. The sampler's counter-based draws are computed here with the same integer hash as
the Triton kernel, in int64 arithmetic masked to 32 bits.
"""

from __future__ import annotations

import torch
from torch.nn import functional

from psrl.kernels.packed import PackedPrefill
from psrl.models.attention import AttentionBatch, attend, prefill_attention_batch
from psrl.models.llama import rms_norm, rotate_pairs

WORD = 0xFFFFFFFF


class TorchStepKernels:
    name = "torch"

    def add_rms_norm(
        self, hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, normed: torch.Tensor
    ) -> None:
        if delta is not None:
            hidden.copy_(hidden + delta)
        normed.copy_(rms_norm(hidden, weight, eps))

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, -1)
        return functional.silu(gate) * up

    def rotary_kv_write(
        self,
        qkv: torch.Tensor,
        rope: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache: torch.Tensor,
        num_heads: int,
    ) -> None:
        num_tokens, num_kv_heads, head_dim = qkv.shape[0], cache.shape[3], cache.shape[4]
        rotated_width = (num_heads + num_kv_heads) * head_dim
        pairs = qkv[:, :rotated_width].view(num_tokens, num_heads + num_kv_heads, head_dim // 2, 2)
        rotation = torch.view_as_complex(rope.index_select(0, positions.long())).unsqueeze(1)
        pairs.copy_(rotate_pairs(pairs, rotation))
        keys = qkv[:, num_heads * head_dim : rotated_width].reshape(num_tokens, 1, num_kv_heads, head_dim)
        values = qkv[:, rotated_width:].reshape(num_tokens, 1, num_kv_heads, head_dim)
        new_kv = torch.cat((keys, values), dim=1)
        cache.view(-1, 2, num_kv_heads, head_dim).index_copy_(0, slots.long(), new_kv)

    def decode_slots(
        self,
        positions: torch.Tensor,
        step: int,
        tables: torch.Tensor,
        num_blocks: torch.Tensor,
        geometry: tuple[int, int, int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        block_size, scratch_block, max_position = geometry
        position = positions.long() + step
        blocks = num_blocks.long()
        index = position // block_size
        owned = index < blocks
        block = tables.long().gather(1, index.clamp(max=tables.shape[1] - 1).unsqueeze(1)).squeeze(1)
        block = torch.where(owned, block, scratch_block)
        slots = block * block_size + position % block_size
        seq_lens = torch.minimum(position + 1, blocks * block_size).to(torch.int32)
        return position.clamp(max=max_position - 1), slots, seq_lens

    def decode_attention(
        self, qkv: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor, seq_lens: torch.Tensor, num_heads: int
    ) -> torch.Tensor:
        num_seqs, head_dim = qkv.shape[0], cache.shape[4]
        num_key_slots = tables.shape[1] * cache.shape[1]
        key_index = torch.arange(num_key_slots, device=qkv.device)
        # a padding row (length 0) attends to one scratch position instead of none, which SDPA turns into NaN
        mask = key_index.unsqueeze(0) < seq_lens.clamp(min=1).unsqueeze(1)
        batch = AttentionBatch(
            slot_mapping=torch.empty(0, dtype=torch.long, device=qkv.device),
            block_tables=tables.reshape(-1).long(),
            mask=mask.view(num_seqs, 1, 1, num_key_slots),
            num_seqs=num_seqs,
            max_query_len=1,
            num_key_slots=num_key_slots,
            query_pad_index=None,
        )
        return attend(qkv[:, : num_heads * head_dim].view(num_seqs, num_heads, head_dim), cache, batch)

    def prefill_attention(
        self, qkv: torch.Tensor, cache: torch.Tensor, prefill: PackedPrefill, num_heads: int
    ) -> torch.Tensor:
        head_dim = cache.shape[4]
        batch = prefill_attention_batch(prefill, cache.shape[1])
        return attend(qkv[:, : num_heads * head_dim].view(qkv.shape[0], num_heads, head_dim), cache, batch)

    def sample(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        seeds: torch.Tensor,
        counters: torch.Tensor,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
    ) -> None:
        x = logits.float()
        is_greedy = (temperatures <= 0).unsqueeze(1)
        scaled = x / torch.where(is_greedy, torch.ones_like(temperatures.unsqueeze(1)), temperatures.unsqueeze(1))
        uniform = counter_uniforms(seeds, counters, x.shape[1])
        keys = torch.where(is_greedy, x, scaled + -torch.log(-torch.log(uniform)))
        chosen = keys.argmax(dim=1)
        tokens.copy_(chosen)
        logprobs.copy_(torch.log_softmax(scaled, dim=1).gather(1, chosen.unsqueeze(1)).squeeze(1))


def counter_uniforms(seeds: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] fp32 uniforms in (0, 1) of (seed, counter, vocabulary index), as the Triton sampler draws them.

    seeds [2, B] int32: the low and high words of each row's 64-bit seed.
    """
    words = seeds.long() & WORD
    counter = counters.long() & WORD
    stream = _mix(words[0] ^ _mix(words[1] ^ _mix(counter ^ 0x9E3779B9)))
    index = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = _mix(stream.unsqueeze(1) ^ ((index * 0x85EBCA6B) & WORD).unsqueeze(0))
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & WORD
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & WORD
    return x ^ (x >> 16)
