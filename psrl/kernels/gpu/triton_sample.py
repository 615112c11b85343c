"""Sampling and log-probabilities on the GPU, in Triton, with counter-based random draws.

Gumbel-max: the sampled token is argmax(logits / T + g) with g = -log(-log(u)) and u a uniform
draw per vocabulary entry, which samples exactly from softmax(logits / T). Each u is a hash of
(the sequence's 64-bit seed, the position of the token being sampled, the vocabulary index), so a
sequence draws the same numbers whatever batch it is in and whichever path runs it (the torch
reference in `reference.py` computes the same hash), and no generator state lives on the host.
Temperature 0 is greedy. The log-probability is that of the temperature-scaled distribution
(temperature 1 for greedy rows), as in psrl.engine.sampler.

Two kernels: the first reduces chunks of each row (max and sum for the log-sum-exp, best key and
its index), the second merges a row's chunks and writes token and log-probability.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096


@triton.jit
def _mix(x):
    # a 32-bit integer finaliser (two multiply-xorshift rounds)
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x846CA68B
    x ^= x >> 16
    return x


@triton.jit
def _sample_chunks_kernel(
    logits, temperatures, seeds, counters, chunk_stats, chunk_index,
    vocab_size, logits_stride, seed_stride, num_chunks, CHUNK_SIZE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    index = chunk * CHUNK_SIZE + tl.arange(0, CHUNK_SIZE)
    mask = index < vocab_size
    x = tl.load(logits + row * logits_stride + index, mask=mask, other=float("-inf")).to(tl.float32)
    temperature = tl.load(temperatures + row)
    is_greedy = temperature <= 0.0
    scaled = x / tl.where(is_greedy, 1.0, temperature)
    seed_low = tl.load(seeds + row).to(tl.uint32)
    seed_high = tl.load(seeds + seed_stride + row).to(tl.uint32)
    counter = tl.load(counters + row).to(tl.uint32)
    stream = _mix(seed_low ^ _mix(seed_high ^ _mix(counter ^ 0x9E3779B9)))
    bits = _mix(stream ^ (index.to(tl.uint32) * 0x85EBCA6B))
    uniform = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    gumbel = -tl.log(-tl.log(uniform))
    key = tl.where(is_greedy, x, scaled + gumbel)
    key = tl.where(mask, key, float("-inf"))
    chunk_max = tl.max(scaled, 0)
    chunk_sum = tl.sum(tl.exp(scaled - chunk_max), 0)
    best = tl.argmax(key, 0)
    best_key = tl.max(key, 0)
    best_scaled = tl.sum(tl.where(tl.arange(0, CHUNK_SIZE) == best, scaled, 0.0), 0)
    stats = chunk_stats + (row * num_chunks + chunk) * 4
    tl.store(stats, chunk_max)
    tl.store(stats + 1, chunk_sum)
    tl.store(stats + 2, best_key)
    tl.store(stats + 3, best_scaled)
    tl.store(chunk_index + row * num_chunks + chunk, chunk * CHUNK_SIZE + best)


@triton.jit
def _sample_merge_kernel(chunk_stats, chunk_index, tokens, logprobs, num_chunks, CHUNKS_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, CHUNKS_PAD)
    mask = chunks < num_chunks
    stats = chunk_stats + (row * num_chunks + chunks) * 4
    chunk_max = tl.load(stats, mask=mask, other=float("-inf"))
    chunk_sum = tl.load(stats + 1, mask=mask, other=0.0)
    best_key = tl.load(stats + 2, mask=mask, other=float("-inf"))
    best_scaled = tl.load(stats + 3, mask=mask, other=0.0)
    overall_max = tl.max(chunk_max, 0)
    log_total = overall_max + tl.log(tl.sum(chunk_sum * tl.exp(chunk_max - overall_max), 0))
    winner = tl.argmax(best_key, 0)
    picked = chunks == winner
    token = tl.sum(tl.where(picked, tl.load(chunk_index + row * num_chunks + chunks, mask=mask, other=0), 0), 0)
    tl.store(tokens + row, token.to(tokens.dtype.element_ty))
    tl.store(logprobs + row, tl.sum(tl.where(picked, best_scaled, 0.0), 0) - log_total)


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
) -> None:
    """Write one token and its log-probability per row of logits [B, V] into tokens [B] and logprobs [B].

    temperatures [B] fp32 (0 = greedy), seeds [2, B] int32 (low and high words of each row's 64-bit seed;
    the row stride may be larger than B), counters [B] (position of the token being sampled).
    """
    rows, vocab_size = logits.shape
    num_chunks = triton.cdiv(vocab_size, CHUNK)
    chunk_stats = torch.empty(rows * num_chunks * 4, dtype=torch.float32, device=logits.device)
    chunk_index = torch.empty(rows * num_chunks, dtype=torch.int32, device=logits.device)
    _sample_chunks_kernel[(rows, num_chunks)](
        logits, temperatures, seeds, counters, chunk_stats, chunk_index,
        vocab_size, logits.stride(0), seeds.stride(0), num_chunks, CHUNK_SIZE=CHUNK, num_warps=8,
    )  # fmt: skip
    _sample_merge_kernel[(rows,)](
        chunk_stats, chunk_index, tokens, logprobs, num_chunks,
        CHUNKS_PAD=max(2, triton.next_power_of_2(num_chunks)), num_warps=1,
    )  # fmt: skip
