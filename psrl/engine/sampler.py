"""Batched sampling with per-request temperature, top-k, top-p, seeds and log-probabilities.

All rows are processed together; per-row Python work happens only for rows that need it (seeded
requests, min_tokens suppression). Sampling is by inverse CDF: one uniform draw per row, located
in the row's cumulative distribution. A seeded row draws from its own generator, so a seed gives
the same samples whatever else is in the batch; one draw per row (not one per vocabulary entry)
keeps sampling cheap for large vocabularies. On the CPU, batches that need no top-k/top-p and no
top log-probs (RL rollouts) run in one fused kernel (psrl.kernels.cpu_sample) with the same draws.

With the GPU step kernels, such batches (and nothing to suppress for min_tokens) are sampled on the
device instead, by the kernel the decode rounds sample with (psrl.kernels.gpu.triton_sample): its
draws depend only on each sequence's `sampling_seed` and the token's position, so the first token
after a prefill and the tokens of decode rounds come from one stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from psrl.engine.sequence import Sequence
from psrl.kernels.cpu_sample import CpuSampleKernel
from psrl.kernels.gpu.step import StepKernels


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    # per row: (token, logprob) pairs of the most likely tokens, for rows that asked for them
    top_logprobs: list[list[tuple[int, float]] | None]


class Sampler:
    def __init__(
        self,
        device: torch.device,
        eos_token_ids: tuple[int, ...],
        seed: int = 0,
        kernel: CpuSampleKernel | None = None,
        step_kernels: StepKernels | None = None,
    ) -> None:
        """`kernel`: the fused CPU sampling kernel, used for batches that need no truncation or top log-probs.

        `step_kernels`: sample such batches with their device sampler instead (when nothing is suppressed).
        """
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.kernel = kernel if device.type == "cpu" else None
        self.step_kernels = step_kernels

    def samples_on_device(self, seqs: list[Sequence]) -> bool:
        """Whether the device sampler covers every row: temperature only, and no stop token to suppress."""
        if not _all_plain(seqs):
            return False
        for seq in seqs:  # per sequence per round: the cheap test first
            if len(seq.token_ids) - seq.num_prompt_tokens < seq.params.min_tokens and self._suppressed_ids(seq):
                return False
        return True

    def make_generator(self, seed: int) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        return generator

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        """logits [len(seqs), vocab] fp32 -> one token per sequence."""
        if self.step_kernels is not None and self.samples_on_device(seqs):
            return self._sample_on_device(self.step_kernels, logits, seqs)
        self._suppress_early_stops(logits, seqs)
        temperatures = [seq.params.temperature for seq in seqs]
        if self.kernel is not None and _all_plain(seqs):
            return self._sample_with_kernel(self.kernel, logits, temperatures, seqs)
        scaled = logits
        if any(t not in (0.0, 1.0) for t in temperatures):
            scale = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=logits.device)
            scaled = logits / scale.unsqueeze(1)
        logprobs_all = torch.log_softmax(scaled, dim=-1)
        token_ids = self._choose(scaled, logprobs_all, seqs)
        chosen = logprobs_all.gather(1, token_ids.unsqueeze(1)).squeeze(1)
        return SampleResult(
            token_ids=token_ids.tolist(),
            logprobs=chosen.tolist(),
            top_logprobs=_top_logprobs(logprobs_all, seqs),
        )

    def _sample_with_kernel(
        self, kernel: CpuSampleKernel, logits: torch.Tensor, temperatures: list[float], seqs: list[Sequence]
    ) -> SampleResult:
        # the same draws from the same generators as the tensor path, so a seed gives the same tokens either way
        uniforms = None if all(t == 0.0 for t in temperatures) else self._uniforms(seqs).view(-1)
        token_ids, logprobs = kernel.sample(logits, temperatures, uniforms)
        return SampleResult(token_ids, logprobs, [None] * len(seqs))

    def _sample_on_device(self, kernels: StepKernels, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        rows, device = len(seqs), logits.device
        seeds = np.array([seq.sampling_seed for seq in seqs], dtype=np.uint64).view(np.int32).reshape(rows, 2)
        temperatures = torch.tensor([seq.params.temperature for seq in seqs], dtype=torch.float32, device=device)
        counters = torch.tensor([seq.num_tokens for seq in seqs], device=device)  # position of the new token
        tokens = torch.empty(rows, dtype=torch.int64, device=device)
        logprobs = torch.empty(rows, dtype=torch.float32, device=device)
        kernels.sample(logits, temperatures, torch.from_numpy(seeds.T.copy()).to(device), counters, tokens, logprobs)
        return SampleResult(tokens.tolist(), logprobs.tolist(), [None] * rows)

    def _choose(self, scaled: torch.Tensor, logprobs_all: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        is_greedy = [seq.params.is_greedy for seq in seqs]
        if all(is_greedy):
            return scaled.argmax(dim=-1)
        if any(seq.params.needs_truncation for seq in seqs):
            logprobs_all = _truncate(logprobs_all, seqs)
        sampled_ids = self._inverse_cdf(logprobs_all.exp(), seqs)
        if not any(is_greedy):
            return sampled_ids
        return torch.where(torch.tensor(is_greedy, device=scaled.device), scaled.argmax(dim=-1), sampled_ids)

    def _inverse_cdf(self, probs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One uniform draw per row located in the row's cumulative distribution (probs need not sum to 1)."""
        uniforms = self._uniforms(seqs)
        cdf = probs.double().cumsum_(dim=-1)
        targets = uniforms * cdf[:, -1:]
        # clamp: a draw equal to the total (rounding) must still land on the last non-zero token
        return torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)

    def _uniforms(self, seqs: list[Sequence]) -> torch.Tensor:
        """[rows, 1] float64 draws: the engine's stream, or a seeded request's own."""
        uniforms = torch.rand(len(seqs), 1, generator=self.generator, device=self.device, dtype=torch.float64)
        for row, seq in enumerate(seqs):
            if seq.generator is not None:
                uniforms[row] = torch.rand(1, generator=seq.generator, device=self.device, dtype=torch.float64)
        return uniforms

    def _suppress_early_stops(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Forbid end-of-sequence and stop tokens for rows that have not reached min_tokens yet."""
        rows: list[int] = []
        token_ids: list[int] = []
        for row, seq in enumerate(seqs):
            stop_ids = self._suppressed_ids(seq)
            rows += [row] * len(stop_ids)
            token_ids += stop_ids
        if rows:  # one indexed write for the whole batch (one per row cost a device round trip each)
            device = logits.device
            logits[torch.tensor(rows, device=device), torch.tensor(token_ids, device=device)] = float("-inf")

    def _suppressed_ids(self, seq: Sequence) -> list[int]:
        """Tokens the next sample of `seq` must not be: its stop tokens (and eos) until min_tokens."""
        params = seq.params
        if seq.num_outputs >= params.min_tokens or (params.ignore_eos and not params.stop_token_ids):
            return []
        return list(params.stop_token_ids) + ([] if params.ignore_eos else list(self.eos_token_ids))


def _all_plain(seqs: list[Sequence]) -> bool:
    """No row needs top-k/top-p truncation or top log-probs (rows of one request group share params)."""
    checked = None
    for seq in seqs:
        params = seq.params
        if params is checked:
            continue
        if params.needs_truncation or params.num_logprobs:
            return False
        checked = params
    return True


def _truncate(logprobs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Mask tokens outside each row's top-k and top-p nucleus (at least one token always stays)."""
    vocab_size = logprobs.shape[1]
    top_ks = torch.tensor(
        [seq.params.top_k if seq.params.top_k > 0 else vocab_size for seq in seqs], device=logprobs.device
    )
    top_ps = torch.tensor([seq.params.top_p for seq in seqs], device=logprobs.device, dtype=logprobs.dtype)
    sorted_logprobs, order = logprobs.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab_size, device=logprobs.device).unsqueeze(0)
    probs = sorted_logprobs.exp()
    mass_before = probs.cumsum(dim=-1) - probs
    is_dropped = (ranks >= top_ks.unsqueeze(1)) | (mass_before >= top_ps.unsqueeze(1))
    is_dropped[:, 0] = False
    sorted_logprobs = sorted_logprobs.masked_fill(is_dropped, float("-inf"))
    return torch.empty_like(logprobs).scatter_(1, order, sorted_logprobs)


def _top_logprobs(logprobs_all: torch.Tensor, seqs: list[Sequence]) -> list[list[tuple[int, float]] | None]:
    wanted = [seq.params.num_logprobs for seq in seqs]
    if not any(wanted):
        return [None] * len(seqs)
    values, indices = logprobs_all.topk(max(wanted), dim=-1)
    rows_values, rows_indices = values.tolist(), indices.tolist()
    return [
        list(zip(rows_indices[row][:count], rows_values[row][:count], strict=True)) if count else None
        for row, count in enumerate(wanted)
    ]
