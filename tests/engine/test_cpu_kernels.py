"""The fused CPU kernels against plain torch on the same inputs.

The decode kernel is checked on its own outputs (attention) and on its side effects (the new
key/value in the paged cache and in the workspace), over head sizes with and without a
specialised copy, grouped and plain multi-head attention, and rows of different lengths. The
sampling kernel is checked against the sampler's own tensor path with the same generators.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from torch.nn import functional

from psrl.engine.sampler import Sampler
from psrl.engine.sampling_params import SamplingParams
from psrl.engine.sequence import Sequence
from psrl.kernels.cpu_decode import AttentionShape, CpuDecodeKernels, DecodeBatch
from psrl.kernels.cpu_sample import CpuSampleKernel
from psrl.models.llama import rotate_pairs


@pytest.fixture(scope="module")
def decode_kernels(cpu_kernels: ctypes.CDLL) -> CpuDecodeKernels:
    return CpuDecodeKernels(cpu_kernels)


@pytest.fixture(scope="module")
def sample_kernel(cpu_kernels: ctypes.CDLL) -> CpuSampleKernel:
    return CpuSampleKernel(cpu_kernels)


def _rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x [B, H, D] with interleaved pairs, rope [B, D/2, 2]: the eager model's own rotation."""
    pairs = x.reshape(*x.shape[:2], -1, 2)
    return rotate_pairs(pairs, torch.view_as_complex(rope.contiguous()).unsqueeze(1)).flatten(2)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 32), (8, 8, 64), (14, 2, 128), (6, 3, 24), (2, 1, 16)])
def test_decode_attention_matches_torch(decode_kernels: CpuDecodeKernels, heads: int, kv_heads: int, dim: int) -> None:
    generator = torch.Generator().manual_seed(heads * 1000 + dim)
    num_seqs, capacity, num_slots = 5, 48, 64
    positions = torch.tensor([0, 7, 31, 47, 12])
    slots = torch.tensor([3, 60, 0, 17, 41])
    qkv = torch.randn(num_seqs, (heads + 2 * kv_heads) * dim, generator=generator)
    rope = torch.randn(80, dim // 2, 2, generator=generator)
    cache = torch.zeros(num_slots, 2, kv_heads, dim)
    keys = torch.randn(num_seqs + 2, kv_heads, capacity, dim, generator=generator)
    values = torch.randn(num_seqs + 2, kv_heads, capacity, dim, generator=generator)
    keys_before, values_before = keys.clone(), values.clone()
    batch = DecodeBatch(AttentionShape(heads, kv_heads, dim), rope, positions, slots, capacity, num_slots)

    out = decode_kernels.decode_attention(qkv, batch, cache, keys, values)

    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1)
    q = _rotate(q.view(num_seqs, heads, dim), rope[positions])
    k = _rotate(k.view(num_seqs, kv_heads, dim), rope[positions])
    v = v.view(num_seqs, kv_heads, dim)
    # the rotation may fuse multiply-adds, so keys agree to rounding; values are copied exactly
    torch.testing.assert_close(cache[slots, 0], k, atol=1e-6, rtol=1e-6)
    assert torch.equal(cache[slots, 1], v)
    for row, (position, slot) in enumerate(zip(positions.tolist(), slots.tolist(), strict=True)):
        assert torch.equal(keys[row, :, position], cache[slot, 0]) and torch.equal(values[row, :, position], v[row])
        keys_before[row, :, position], values_before[row, :, position] = cache[slot, 0], v[row]
        length = position + 1
        expected = functional.scaled_dot_product_attention(
            q[row].unsqueeze(1), keys[row, :, :length], values[row, :, :length], enable_gqa=heads != kv_heads
        )
        torch.testing.assert_close(out[row], expected.flatten(), atol=1e-5, rtol=1e-5)
    # nothing else in the workspace was touched
    assert torch.equal(keys, keys_before) and torch.equal(values, values_before)


def test_decode_batch_refuses_what_the_kernel_cannot_take(decode_kernels: CpuDecodeKernels) -> None:
    shape, rope = AttentionShape(4, 2, 8), torch.zeros(16, 4, 2)
    with pytest.raises(ValueError, match="positions must lie in"):
        DecodeBatch(shape, rope, torch.tensor([16]), torch.tensor([0]), capacity=32, num_cache_slots=8)
    with pytest.raises(ValueError, match="cache slots must lie in"):
        DecodeBatch(shape, rope, torch.tensor([1]), torch.tensor([8]), capacity=32, num_cache_slots=8)
    batch = DecodeBatch(shape, rope, torch.tensor([1]), torch.tensor([0]), capacity=32, num_cache_slots=8)
    qkv, cache = torch.zeros(1, 64), torch.zeros(8, 2, 2, 8)
    with pytest.raises(ValueError, match="workspace keys"):
        decode_kernels.decode_attention(qkv, batch, cache, torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 16, 8))
    with pytest.raises(ValueError, match="contiguous float32"):
        workspace = torch.zeros(1, 2, 32, 8)
        decode_kernels.decode_attention(qkv.double(), batch, cache, workspace, workspace)


def test_rms_norm_and_silu_mul_match_torch(decode_kernels: CpuDecodeKernels) -> None:
    x, weight = torch.randn(7, 96) * 3, torch.randn(96)
    torch.testing.assert_close(decode_kernels.rms_norm(x, weight, 1e-6), functional.rms_norm(x, (96,), weight, 1e-6))
    gate_up = torch.randn(7, 2 * 40) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(decode_kernels.silu_mul(gate_up), functional.silu(gate) * up)


def _sample_both_ways(sample_kernel: CpuSampleKernel, logits: torch.Tensor, params: list[SamplingParams]) -> list:
    """The sampler's results with its kernel and with its tensor path, from generators seeded alike."""
    results = []
    for kernel in (sample_kernel, None):
        sampler = Sampler(torch.device("cpu"), (1,), seed=7, kernel=kernel)
        seqs = [Sequence(str(i), [2, 3], p, i, generator=sampler.make_generator(p.seed) if p.seed else None)
                for i, p in enumerate(params)]  # fmt: skip
        results.append(sampler.sample(logits.clone(), seqs))
    return results


@pytest.mark.parametrize("vocab", [48, 1000, 5003])
def test_sampling_kernel_draws_what_the_tensor_path_draws(sample_kernel: CpuSampleKernel, vocab: int) -> None:
    logits = torch.randn(300, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    params = [SamplingParams(temperature=(0.0, 0.5, 1.0, 1.7)[row % 4]) for row in range(300)]
    with_kernel, tensor_path = _sample_both_ways(sample_kernel, logits, params)
    assert with_kernel.token_ids == tensor_path.token_ids
    assert with_kernel.logprobs == pytest.approx(tensor_path.logprobs, abs=1e-5)


def test_sampling_kernel_never_draws_a_suppressed_token(sample_kernel: CpuSampleKernel) -> None:
    logits = torch.zeros(64, 10)
    logits[:, ::2] = float("-inf")
    uniforms = torch.linspace(0, 1 - 1e-12, 64, dtype=torch.float64)
    tokens, logprobs = sample_kernel.sample(logits, [1.0] * 64, uniforms)
    assert all(token % 2 == 1 for token in tokens)
    assert logprobs == pytest.approx([-torch.log(torch.tensor(5.0)).item()] * 64)
    assert sorted(set(tokens)) == [1, 3, 5, 7, 9]  # the draws spread over every allowed token
    with pytest.raises(ValueError, match="no finite value"):
        sample_kernel.sample(torch.full((1, 4), float("-inf")), [1.0], torch.zeros(1, dtype=torch.float64))


def test_sampler_gives_the_same_tokens_with_and_without_the_kernel(sample_kernel: CpuSampleKernel) -> None:
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(0)) * 2
    params = [SamplingParams(temperature=(0.0, 1.0, 0.8)[i % 3], seed=i if i % 2 else None) for i in range(16)]
    results = _sample_both_ways(sample_kernel, logits, params)
    assert results[0].token_ids == results[1].token_ids
    assert results[0].logprobs == pytest.approx(results[1].logprobs, abs=1e-5)
