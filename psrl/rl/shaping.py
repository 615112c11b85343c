"""Reward shaping on response length: DAPO's overlong penalty.

A response longer than `max_length - buffer_len` tokens loses `penalty_factor` times the share of
the buffer it entered, reaching `-penalty_factor` at `max_length`: a soft signal against truncation
that starts before the hard cut, so the model learns to stop before the limit rather than being
graded on responses the limit cut off.
"""

from __future__ import annotations

from torch import Tensor


def overlong_penalty(lengths: Tensor, *, max_length: int, buffer_len: int, penalty_factor: float) -> Tensor:
    """`[B]` penalties (<= 0) for responses of `lengths` tokens."""
    expected = max_length - buffer_len
    exceed = lengths.float() - expected
    return (-exceed / buffer_len * penalty_factor).clamp(max=0.0)
