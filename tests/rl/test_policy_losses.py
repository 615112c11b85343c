"""Policy losses (PPO with dual clip, GSPO, CISPO), their gradients, and the Dr.GRPO normaliser,
against the numpy reference on random data and at the edges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from psrl.config.training import PolicyLoss
from psrl.rl.losses import aggregate, policy_loss
from psrl.rl.policy_losses import cispo_loss, configured_policy_loss, gspo_loss

from . import reference


def random_case(seed: int, rows: int = 5, length: int = 6, spread: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 2
    lp = (old + torch.randn(rows, length, generator=g, dtype=torch.float64) * spread).clamp(max=0.0)
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, length).clone()
    mask = (torch.rand(rows, length, generator=g, dtype=torch.float64) > 0.25).double()
    mask[0] = 0.0  # a zero-length response
    return lp.requires_grad_(True), old, adv, mask


def grad_of(loss: torch.Tensor, lp: torch.Tensor) -> np.ndarray:
    (grad,) = torch.autograd.grad(loss, lp, retain_graph=True)
    return grad.numpy()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("c", [None, 3.0, 1.05])
def test_ppo_and_dual_clip_match_reference(seed: int, c: float | None) -> None:
    lp, old, adv, mask = random_case(seed, spread=0.5)
    terms = policy_loss(lp, old, adv, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=c)
    loss = aggregate(terms.token_losses, mask, "token-mean")
    values, grads = reference.ppo(lp.detach().numpy(), old.numpy(), adv.numpy(), 0.2, 0.28, c)
    n = mask.sum().item()
    np.testing.assert_allclose(loss.item(), (values * mask.numpy()).sum() / n, rtol=1e-10)
    np.testing.assert_allclose(grad_of(loss, lp), grads * mask.numpy() / n, rtol=1e-9, atol=1e-12)


def test_dual_clip_caps_negative_advantages_only() -> None:
    lp = torch.log(torch.tensor([5.0, 5.0, 1.0], dtype=torch.float64))
    old = torch.zeros(3, dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
    terms = policy_loss(lp, old, adv, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    torch.testing.assert_close(terms.token_losses, torch.tensor([3.0, -1.2, 1.0], dtype=torch.float64))
    assert terms.is_clipped.tolist() == [True, True, False]


def test_ppo_ratio_exactly_at_the_clip_bound_keeps_its_gradient() -> None:
    lp = torch.tensor([[0.25, -0.25]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    ratio = torch.exp(lp.detach() - old)
    high, low = float(ratio[0, 0]) - 1.0, 1.0 - float(ratio[0, 1])
    assert 1.0 + high == float(ratio[0, 0]) and 1.0 - low == float(ratio[0, 1])
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    terms = policy_loss(lp, old, adv, clip_ratio_low=low, clip_ratio_high=high)
    assert not bool(terms.is_clipped.any())
    _, grads = reference.ppo(lp.detach().numpy(), old.numpy(), adv.numpy(), low, high, None)
    np.testing.assert_allclose(grad_of(terms.token_losses.sum(), lp), grads, rtol=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("low", "high"), [(3e-4, 4e-4), (0.2, 0.2), (10.0, 10.0)])
def test_gspo_matches_the_sequence_objective(seed: int, low: float, high: float) -> None:
    lp, old, adv, mask = random_case(seed, spread=0.05)
    terms = gspo_loss(lp, old, adv, mask, clip_ratio_low=low, clip_ratio_high=high)
    loss = aggregate(terms.token_losses, mask, "seq-mean-token-mean")
    value, grads = reference.gspo_objective(lp.detach().numpy(), old.numpy(), adv.numpy(), mask.numpy(), low, high)
    np.testing.assert_allclose(loss.item(), value, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(grad_of(loss, lp), grads, rtol=1e-8, atol=1e-14)


def test_gspo_ratio_is_one_value_per_sequence() -> None:
    lp, old, adv, mask = random_case(9, spread=0.1)
    terms = gspo_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    for row in range(1, lp.shape[0]):
        values = terms.ratio[row][mask[row] > 0]
        torch.testing.assert_close(values, values[:1].expand_as(values))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("low", "high"), [(1.0, 0.28), (0.2, 0.2)])
def test_cispo_matches_reference(seed: int, low: float, high: float) -> None:
    lp, old, adv, mask = random_case(seed, spread=0.5)
    terms = cispo_loss(lp, old, adv, clip_ratio_low=low, clip_ratio_high=high)
    loss = aggregate(terms.token_losses, mask, "token-mean")
    values, grads = reference.cispo(lp.detach().numpy(), old.numpy(), adv.numpy(), low, high)
    n = mask.sum().item()
    np.testing.assert_allclose(loss.item(), (values * mask.numpy()).sum() / n, rtol=1e-10)
    np.testing.assert_allclose(grad_of(loss, lp), grads * mask.numpy() / n, rtol=1e-10, atol=1e-14)


def test_cispo_keeps_the_gradient_of_clipped_tokens() -> None:
    lp = torch.tensor([0.9], dtype=torch.float64, requires_grad=True)  # ratio e^0.9, far above 1.28
    old = torch.zeros(1, dtype=torch.float64)
    adv = torch.ones(1, dtype=torch.float64)
    ppo_grad = grad_of(policy_loss(lp, old, adv, clip_ratio_low=0.2, clip_ratio_high=0.28).token_losses.sum(), lp)
    cispo_grad = grad_of(cispo_loss(lp, old, adv, clip_ratio_low=1.0, clip_ratio_high=0.28).token_losses.sum(), lp)
    assert ppo_grad[0] == 0.0 and cispo_grad[0] == pytest.approx(-1.28)


@pytest.mark.parametrize("mode", ["ppo", "gspo", "cispo"])
def test_all_masked_gives_zero_loss_and_gradient(mode: str) -> None:
    lp, old, adv, mask = random_case(1)
    mask = torch.zeros_like(mask)
    config = PolicyLoss(loss_mode=mode)  # type: ignore[arg-type]
    terms = configured_policy_loss(lp, old, adv, mask, config, clip_ratio_low=0.2, clip_ratio_high=0.2)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        loss = aggregate(terms.token_losses, mask, agg)  # type: ignore[arg-type]
        assert loss.item() == 0.0
        assert np.all(grad_of(loss, lp) == 0.0)


def test_is_weights_scale_every_loss() -> None:
    lp, old, adv, mask = random_case(2)
    weights = torch.rand(lp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for mode in ("ppo", "gspo", "cispo"):
        config = PolicyLoss(loss_mode=mode)  # type: ignore[arg-type]
        plain = configured_policy_loss(lp, old, adv, mask, config, clip_ratio_low=0.2, clip_ratio_high=0.2)
        weighted = configured_policy_loss(lp, old, adv, mask, config, clip_ratio_low=0.2, clip_ratio_high=0.2,
                                          is_weights=weights)  # fmt: skip
        torch.testing.assert_close(weighted.token_losses, plain.token_losses * weights)


def test_dr_grpo_normaliser_is_a_constant() -> None:
    g = torch.Generator().manual_seed(3)
    values = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=g, dtype=torch.float64) > 0.3).double()
    expected = float((values * mask).sum()) / (6 * 32)
    whole = aggregate(values, mask, "seq-mean-token-sum-norm", token_norm=32)
    assert whole.item() == pytest.approx(expected, rel=1e-12)
    # any split into micro-batches, even by columns, sums to the whole: the normaliser is no padded length
    parts = 0.0
    for i in range(0, 6, 2):
        cut = 2 + i // 2
        for cols in (slice(None, cut), slice(cut, None)):
            part = aggregate(values[i : i + 2, cols], mask[i : i + 2, cols], "seq-mean-token-sum-norm",
                             num_seqs=6, token_norm=32)  # fmt: skip
            parts += float(part)
    assert float(parts) == pytest.approx(expected, rel=1e-12)
    assert aggregate(values, mask, "seq-mean-token-sum-norm").item() == pytest.approx(
        float((values * mask).sum()) / (6 * 5)
    )  # unset: the batch's padded length
