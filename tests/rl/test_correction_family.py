"""Rollout correction (importance weights, rejection, veto) against the numpy reference, with edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from psrl.rl.correction import CorrectionSpec, correct, level_log_ratio, truncated_weights

from . import reference

LEVELS = ("token", "sequence", "geometric")


def random_case(seed: int, rows: int = 6, length: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(old, rollout log-probs, mask) in float64, with an all-masked row and a full one."""
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 3
    old = rollout + torch.randn(rows, length, generator=g, dtype=torch.float64) * 0.6
    mask = (torch.rand(rows, length, generator=g, dtype=torch.float64) > 0.3).double()
    mask[0] = 0.0  # a zero-length response
    mask[1] = 1.0
    return old, rollout, mask


def np_log_ratio(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    return ((old - rollout) * mask).numpy()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", LEVELS)
def test_is_weights_match_reference(seed: int, level: str) -> None:
    old, rollout, mask = random_case(seed)
    spec = CorrectionSpec(is_level=level, is_upper=1.6, is_lower=0.7)  # type: ignore[arg-type]
    result = correct(old, rollout, mask, spec)
    expected = reference.is_weights(np_log_ratio(old, rollout, mask), mask.numpy(), level, 0.7, 1.6)
    assert result.is_weights is not None and result.accept is None
    np.testing.assert_allclose(result.is_weights.numpy(), expected, rtol=1e-12, atol=1e-12)
    assert not result.is_weights.requires_grad


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", LEVELS)
def test_rejection_matches_reference(seed: int, level: str) -> None:
    old, rollout, mask = random_case(seed)
    spec = CorrectionSpec(rs_level=level, rs_upper=1.5, rs_lower=0.8)  # type: ignore[arg-type]
    result = correct(old, rollout, mask, spec)
    expected = reference.accept(np_log_ratio(old, rollout, mask), mask.numpy(), level, 0.8, 1.5)
    assert result.accept is not None and result.is_weights is None
    np.testing.assert_array_equal(result.accept.numpy(), expected)


def test_rejection_lower_bound_defaults_to_the_reciprocal() -> None:
    old, rollout, mask = random_case(4)
    result = correct(old, rollout, mask, CorrectionSpec(rs_level="token", rs_upper=1.5))
    expected = reference.accept(np_log_ratio(old, rollout, mask), mask.numpy(), "token", 1 / 1.5, 1.5)
    assert result.accept is not None
    np.testing.assert_array_equal(result.accept.numpy(), expected)


def test_veto_masks_whole_rows_and_combines_with_rejection() -> None:
    old, rollout, mask = random_case(5)
    old[2, 1] = rollout[2, 1] - 12.0  # ratio e^-12: below any sensible veto
    mask[2, 1] = 1.0
    spec = CorrectionSpec(rs_level="token", rs_upper=3.0, rs_lower=0.2, veto=1e-4)
    result = correct(old, rollout, mask, spec)
    log_ratio = np_log_ratio(old, rollout, mask)
    vetoed = reference.vetoed(log_ratio, mask.numpy(), 1e-4)
    assert vetoed.tolist() == result.vetoed.tolist() and vetoed[2]
    expected = reference.accept(log_ratio, mask.numpy(), "token", 0.2, 3.0) * (~vetoed)[:, None]
    assert result.accept is not None
    np.testing.assert_array_equal(result.accept.numpy(), expected)
    assert float(result.accept[2].sum()) == 0.0


def test_veto_alone_keeps_the_other_rows_whole() -> None:
    old, rollout, mask = random_case(6)
    result = correct(old, rollout, mask, CorrectionSpec(veto=1e-9))  # nothing that extreme
    assert result.accept is not None
    torch.testing.assert_close(result.accept, mask)


def test_all_masked_batch_gives_zeros_and_no_nan() -> None:
    old, rollout, _ = random_case(7)
    mask = torch.zeros_like(old)
    for level in LEVELS:
        spec = CorrectionSpec(is_level=level, rs_level=level, rs_upper=2.0, veto=1e-3)  # type: ignore[arg-type]
        result = correct(old, rollout, mask, spec)
        assert result.is_weights is not None and result.accept is not None
        assert float(result.is_weights.abs().sum()) == 0.0 and float(result.accept.sum()) == 0.0
        assert not bool(result.truncated.any()) and not bool(result.vetoed.any())


def test_ratio_exactly_at_a_bound_is_kept_and_not_truncated() -> None:
    old = torch.tensor([[0.0, math.log(2.0), -math.log(2.0)]], dtype=torch.float64)
    rollout = torch.zeros_like(old)
    mask = torch.ones_like(old)
    ratio = torch.exp(old - rollout)
    upper, lower = float(ratio[0, 1]), float(ratio[0, 2])  # the bounds are the ratios themselves
    weights, truncated = truncated_weights(old - rollout, lower, upper)
    torch.testing.assert_close(weights, ratio)
    assert not bool(truncated.any())
    result = correct(old, rollout, mask, CorrectionSpec(rs_level="token", rs_upper=upper, rs_lower=lower))
    assert result.accept is not None and result.accept.tolist() == [[1.0, 1.0, 1.0]]
    nudged = correct(old, rollout, mask, CorrectionSpec(rs_level="token", rs_upper=upper * (1 - 1e-12),
                                                         rs_lower=lower * (1 + 1e-12)))  # fmt: skip
    assert nudged.accept is not None and nudged.accept.tolist() == [[1.0, 0.0, 0.0]]


def test_sequence_level_log_ratio_is_clamped_not_overflowing() -> None:
    log_ratio = torch.full((1, 50), 1.0, dtype=torch.float64)
    mask = torch.ones_like(log_ratio)
    level = level_log_ratio(log_ratio, mask, "sequence")
    assert torch.isfinite(torch.exp(level)).all() and float(level[0, 0]) == 20.0
    torch.testing.assert_close(level_log_ratio(log_ratio, mask, "geometric"), log_ratio)


def test_describe_names_every_part() -> None:
    spec = CorrectionSpec(is_level="sequence", is_upper=2.0, is_lower=0.5, rs_level="token", rs_upper=5.0, veto=1e-4)
    assert spec.describe() == "is=sequence[0.5,2];rs=token[0.2,5];veto=0.0001"
    assert CorrectionSpec().describe() == "none" and not CorrectionSpec().is_active
