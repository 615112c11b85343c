"""Rotary position embeddings: inverse frequencies for each scaling type, and cos/sin tables.

The tables are computed once (in fp32) for every position up to the engine's context length and
indexed by position at run time. The formulas follow the published definitions as implemented by
transformers, so logits agree with it to float rounding.
"""

from __future__ import annotations

import math

import torch

from psrl.models.spec import RopeSpec


def inverse_frequencies(rope: RopeSpec, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] in fp32, attention factor applied to cos and sin)."""
    base = _base_inverse_frequencies(rope.theta, head_dim)
    params = rope.params
    if rope.rope_type == "linear":
        return base / float(params["factor"]), 1.0
    if rope.rope_type == "llama3":
        return _llama3(base, params), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope.theta, head_dim, params)
    # "default", and "dynamic", which equals the default inside max_position_embeddings (the engine
    # never runs past it)
    return base, 1.0


def cos_sin_table(rope: RopeSpec, head_dim: int, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width tables cos[pos, head_dim/2] and sin[pos, head_dim/2] in fp32."""
    inv_freq, attention_factor = inverse_frequencies(rope, head_dim)
    positions = torch.arange(num_positions, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    return freqs.cos() * attention_factor, freqs.sin() * attention_factor


def _base_inverse_frequencies(theta: float, head_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def _llama3(inv_freq: torch.Tensor, params: dict[str, float]) -> torch.Tensor:
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(theta: float, head_dim: int, params: dict[str, float]) -> tuple[torch.Tensor, float]:
    factor = float(params["factor"])
    original_max = float(params["original_max_position_embeddings"])
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)
    low = _yarn_correction_dim(beta_fast, head_dim, theta, original_max)
    high = _yarn_correction_dim(beta_slow, head_dim, theta, original_max)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).to(torch.float32) / head_dim)
    extrapolation_weight = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_dim(num_rotations: float, dim: int, base: float, max_positions: float) -> float:
    return (dim * math.log(max_positions / (num_rotations * 2 * math.pi))) / (2 * math.log(base))
