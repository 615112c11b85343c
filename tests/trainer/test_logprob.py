"""Fused, chunked log-prob and entropy against the reference computed from materialised logits."""

from __future__ import annotations

import pytest
import torch

from psrl.rl.losses import entropy_from_logits
from psrl.trainer.logprob import chunk_rows, fused_log_probs, reference_log_probs


def reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float):
    logits = (hidden @ weight.T).float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    return log_probs, entropy_from_logits(logits)


def inputs(n: int = 37, h: int = 16, vocab: int = 50, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    generator = torch.Generator().manual_seed(n * vocab)
    hidden = torch.randn(n, h, generator=generator).to(device, dtype).requires_grad_()
    weight = (0.5 * torch.randn(vocab, h, generator=generator)).to(device, dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=generator).to(device)
    return hidden, weight, targets


def loss_of(log_probs: torch.Tensor, entropy: torch.Tensor, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(log_probs.shape, generator=generator).to(log_probs.device)
    b = torch.randn(entropy.shape, generator=generator).to(entropy.device)
    return (a * log_probs).sum() + (b * entropy).sum()


@pytest.mark.parametrize("chunk_size", [1, 5, 16, None])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_values_and_gradients_equal_the_reference(chunk_size: int | None, temperature: float) -> None:
    hidden, weight, targets = inputs()
    log_probs, entropy = fused_log_probs(hidden, weight, targets, temperature=temperature, with_entropy=True,
                                         chunk_size=chunk_size)  # fmt: skip
    assert entropy is not None
    grads = torch.autograd.grad(loss_of(log_probs, entropy), (hidden, weight))
    ref_log_probs, ref_entropy = reference(hidden, weight, targets, temperature)
    ref_grads = torch.autograd.grad(loss_of(ref_log_probs, ref_entropy), (hidden, weight))
    torch.testing.assert_close(log_probs, ref_log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_log_probs_alone_and_a_frozen_head() -> None:
    hidden, weight, targets = inputs()
    weight.requires_grad_(False)
    log_probs, entropy = fused_log_probs(hidden, weight, targets, chunk_size=8)
    assert entropy is None
    (grad,) = torch.autograd.grad(log_probs.sum(), (hidden,))
    ref, _ = reference(hidden, weight, targets, 1.0)
    (ref_grad,) = torch.autograd.grad(ref.sum(), (hidden,))
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4)


def test_bf16_autocast_matches_the_autocast_reference() -> None:
    hidden, weight, targets = inputs(n=64, h=32, vocab=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_probs, entropy = fused_log_probs(hidden, weight, targets, with_entropy=True, chunk_size=24)
        assert entropy is not None
        grads = torch.autograd.grad(loss_of(log_probs, entropy), (hidden, weight))
        logits = torch.nn.functional.linear(hidden, weight).float()  # bf16 matmul, as the model's head
        ref_log_probs, ref_entropy = reference_log_probs(logits, targets, with_entropy=True)
        assert ref_entropy is not None
        ref_grads = torch.autograd.grad(loss_of(ref_log_probs, ref_entropy), (hidden, weight))
    torch.testing.assert_close(log_probs, ref_log_probs, atol=1e-4, rtol=1e-4)  # same bf16 logits, fp32 after
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)  # bf16 gradient matmuls


def test_chunks_bound_the_logits_memory() -> None:
    assert chunk_rows(151_936) * 151_936 * 8 <= 256 * 2**20
    assert chunk_rows(48) > 100_000  # a tiny vocabulary: the whole micro-batch in one chunk


def test_bad_shapes_are_refused() -> None:
    hidden, weight, targets = inputs()
    with pytest.raises(ValueError, match="one target per row"):
        fused_log_probs(hidden, weight, targets[:-1])
    with pytest.raises(ValueError, match="temperature"):
        fused_log_probs(hidden, weight, targets, temperature=0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_in_bf16_with_a_large_vocabulary() -> None:
    hidden, weight, targets = inputs(n=2048, h=256, vocab=32_000, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        log_probs, entropy = fused_log_probs(hidden, weight, targets, with_entropy=True, chunk_size=512)
        assert entropy is not None
        grads = torch.autograd.grad(loss_of(log_probs, entropy), (hidden, weight))
        logits = torch.nn.functional.linear(hidden, weight).float()
        ref_log_probs, ref_entropy = reference_log_probs(logits, targets, with_entropy=True)
        assert ref_entropy is not None
        ref_grads = torch.autograd.grad(loss_of(ref_log_probs, ref_entropy), (hidden, weight))
    torch.testing.assert_close(log_probs, ref_log_probs, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-3, rtol=1e-3)
    for got, want in zip(grads, ref_grads, strict=True):
        cosine = torch.nn.functional.cosine_similarity(got.float().flatten(), want.float().flatten(), dim=0)
        assert cosine > 0.999
