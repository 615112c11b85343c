"""Per-token log-prob and entropy fused with the LM head, in chunks of tokens.

`fused_log_probs(hidden, weight, targets)` returns, for each of the `n` rows of `hidden`, the
log-probability of its target token under softmax(hidden @ weight.T / temperature) and (optionally)
the entropy of that distribution, without ever holding the `[n x vocab]` logits: the rows go through
the LM head in chunks small enough that one chunk's float32 logits stay within
`LOGITS_CHUNK_BYTES`, and the backward pass recomputes each chunk's logits instead of keeping them
(the usual fused linear cross-entropy; Liger-kernel's is the CUDA/Triton version of the same).

Numbers: the matmul runs in the autocast dtype when autocast is on (as `nn.Linear` would), the
softmax, log-prob and entropy in float32. The gradient of a chunk's logits `z` (after temperature,
`p = softmax(z)`, `mu = sum p z`) is

    d logp[target] / dz = onehot(target) - p
    d entropy / dz      = -p * (z - mu)

and flows into `hidden` (`dz @ weight / T`) and `weight` (`dz.T @ hidden / T`).

Why not Liger-kernel: its fused linear cross-entropy (0.8.5: per-token ``reduction="none"`` with
recomputed chunk gradients) gives the log-prob but not the entropy the actor loss and its metrics
need, and it is Triton-only (no CPU path). This pure-torch version runs the same chunked matmuls
(cuBLAS on a GPU) on both devices; a Triton softmax-and-gradient kernel per chunk is what Liger
would add on top, worth measuring on the GPU against `tools/bench_logprob.py`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# float32 logits of one chunk: at a 152k vocabulary, about 440 rows; the whole micro-batch for small vocabularies
LOGITS_CHUNK_BYTES = 256 * 2**20
# on a GPU, fewer and larger chunks: each chunk also adds a [vocab x hidden] float32 partial of the
# head's gradient, whose traffic dominated at 440-row chunks (still a few GiB against the tens of
# GiB of whole-batch logits)
LOGITS_CHUNK_BYTES_CUDA = 2 * 2**30


def chunk_rows(vocab: int, budget_bytes: int = LOGITS_CHUNK_BYTES) -> int:
    """Rows per chunk: as many as keep a chunk's float32 logits (and their softmax) within the budget."""
    return max(1, budget_bytes // (2 * 4 * vocab))


def fused_log_probs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(log-prob of `targets` [n], entropy [n] or None) from `hidden` [n, h] and the LM head `weight` [V, h]."""
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden [n, h] and weight [V, h] expected; got {tuple(hidden.shape)}, {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"one target per row expected; got {tuple(targets.shape)} for {hidden.shape[0]} rows")
    if temperature <= 0.0:
        raise ValueError(f"temperature must be positive for log-probs; got {temperature}")
    budget = LOGITS_CHUNK_BYTES_CUDA if hidden.device.type == "cuda" else LOGITS_CHUNK_BYTES
    rows = chunk_size or chunk_rows(weight.shape[0], budget)
    dtype = _matmul_dtype(hidden, weight)
    log_probs, entropy = _FusedLogProbs.apply(hidden, weight, targets, temperature, with_entropy, rows, dtype)  # type: ignore[no-untyped-call]
    return log_probs, entropy if with_entropy else None


def _matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _chunk_logits(hidden: Tensor, weight: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """`weight` already in `dtype` (cast once per pass, not per chunk)."""
    logits = (hidden.to(dtype) @ weight.T).float()
    return logits / temperature if temperature != 1.0 else logits


class _FusedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        temperature: float,
        with_entropy: bool,
        rows: int,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            head = weight.to(dtype)
            for start in range(0, n, rows):
                end = min(n, start + rows)
                logits = _chunk_logits(hidden[start:end], head, dtype, temperature)
                lse = torch.logsumexp(logits, dim=-1)
                log_probs[start:end] = logits.gather(-1, targets[start:end, None]).squeeze(-1) - lse
                if with_entropy:
                    probs = (logits - lse[:, None]).exp_()  # one more chunk-sized buffer
                    entropy[start:end] = lse - torch.bmm(probs[:, None, :], logits[:, :, None]).flatten()
                    del probs
        ctx.save_for_backward(hidden, weight, targets)
        ctx.options = (temperature, with_entropy, rows, dtype)
        ctx.mark_non_differentiable(targets)
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: Tensor, grad_entropy: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, targets = ctx.saved_tensors
        temperature, with_entropy, rows, dtype = ctx.options
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        with torch.autocast(hidden.device.type, enabled=False):
            head = weight.to(dtype)
            for start in range(0, hidden.shape[0], rows):
                end = min(hidden.shape[0], start + rows)
                h = hidden[start:end].to(dtype)
                logits = _chunk_logits(h, head, dtype, temperature)
                probs = torch.softmax(logits, dim=-1)
                if with_entropy and grad_entropy is not None:
                    # d entropy / dz = -p (z - mu), built in place of the logits
                    mean = torch.bmm(probs[:, None, :], logits[:, :, None]).squeeze(-1)  # sum p z, no [n x V] temporary
                    entropy_term = logits.sub_(mean).mul_(probs).mul_(-grad_entropy[start:end, None])
                else:
                    entropy_term = None
                del logits
                # d logp / dz = onehot - p, scaled by the incoming gradient, in place of the softmax
                grad_z = probs.mul_(-grad_log_probs[start:end, None])
                grad_z.scatter_add_(-1, targets[start:end, None], grad_log_probs[start:end, None])
                if entropy_term is not None:
                    grad_z += entropy_term
                    del entropy_term
                if temperature != 1.0:
                    grad_z /= temperature
                grad_z = grad_z.to(dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = (grad_z @ head).to(hidden.dtype)
                if grad_weight is not None and dtype == torch.float32:
                    grad_weight.addmm_(grad_z.T, h)
                elif grad_weight is not None:
                    grad_weight += (grad_z.T @ h).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def reference_log_probs(logits: Tensor, targets: Tensor, *, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """The unfused computation from materialised float32 logits [..., V] (for tests and for FSDP2 models)."""
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return log_probs, None
    entropy = -(torch.exp(log_softmax) * log_softmax).sum(dim=-1)
    return log_probs, entropy
