"""Advantage estimators, losses and rollout correction against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from psrl.config import load_config
from psrl.rl.advantages import gae_advantages, grpo_advantages, reinforce_pp_advantages, token_level_rewards
from psrl.rl.batch import Sample, collate
from psrl.rl.correction import token_is_weights
from psrl.rl.losses import aggregate, entropy_from_logits, kl_penalty, policy_loss, value_loss
from psrl.rl.objective import Denominators, actor_loss, compute_advantages
from psrl.rl.trajectory import Trajectory

T = torch.tensor


def close(actual: torch.Tensor, expected: list[float] | list[list[float]] | float, tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual.float(), T(expected, dtype=torch.float32), atol=tol, rtol=0)


class TestAdvantages:
    def test_grpo_normalised_by_unbiased_std(self) -> None:
        rewards = T([1.0, 0.0, 1.0, 1.0, 0.3])
        groups = T([0, 0, 1, 1, 2])
        mask = torch.ones(5, 2)
        adv = grpo_advantages(rewards, groups, mask)
        s = 0.5 / (math.sqrt(0.5) + 1e-6)  # mean 0.5, unbiased std sqrt(0.5)
        close(adv[:, 0], [s, -s, 0.0, 0.0, 0.0])  # equal rewards and a group of one give 0
        close(grpo_advantages(rewards, groups, mask, norm_by_std=False)[:, 1], [0.5, -0.5, 0.0, 0.0, 0.0])

    def test_grpo_respects_mask(self) -> None:
        adv = grpo_advantages(T([1.0, 0.0]), T([0, 0]), T([[1.0, 0.0], [1.0, 1.0]]))
        assert adv[0, 1] == 0.0 and adv[1, 1] != 0.0

    def test_token_level_rewards_on_last_token(self) -> None:
        close(token_level_rewards(T([2.0, 3.0, 4.0]), T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])),
              [[0.0, 2.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # fmt: skip

    def test_gae_hand_computed(self) -> None:
        rewards = T([[0.0, 1.0]])
        values = T([[0.5, 0.25]])
        mask = torch.ones(1, 2)
        adv, returns = gae_advantages(rewards, values, mask, mask, gamma=1.0, lam=1.0)
        close(returns, [[1.0, 1.0]])  # raw advantages [0.5, 0.75] + values
        close(adv, [[-1 / math.sqrt(2), 1 / math.sqrt(2)]], tol=1e-4)  # whitened [0.5, 0.75]
        _, returns = gae_advantages(rewards, values, mask, mask, gamma=0.9, lam=0.8)
        # delta1 = 1 - 0.25 = 0.75; delta0 = 0.9*0.25 - 0.5 = -0.275; adv0 = -0.275 + 0.72*0.75 = 0.265
        close(returns, [[0.265 + 0.5, 0.75 + 0.25]])

    def test_gae_ignores_padding_value(self) -> None:
        rewards = T([[1.0, 0.0]])
        values = T([[0.5, 9.0]])  # value at the padded position must not leak into the last token
        mask = T([[1.0, 0.0]])
        _, returns = gae_advantages(rewards, values, mask, mask, gamma=1.0, lam=1.0)
        close(returns[0, 0], 1.0)

    def test_reinforce_pp_hand_computed(self) -> None:
        mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
        token_rewards = token_level_rewards(T([1.0, 0.0]), mask)
        adv, returns = reinforce_pp_advantages(token_rewards, mask, gamma=0.5)
        close(returns, [[0.25, 0.5, 1.0], [0.0, 0.0, 0.0]])
        values = T([0.25, 0.5, 1.0, 0.0])
        std = math.sqrt(((values - values.mean()) ** 2).sum().item() / 3)
        expected = ((values - values.mean()) / std).tolist()
        close(adv, [expected[:3], [expected[3], 0.0, 0.0]], tol=1e-4)


class TestLosses:
    def test_asymmetric_clip(self) -> None:
        log_probs = torch.log(T([1.5, 0.5, 0.5, 1.25]))
        old = torch.zeros(4)
        adv = T([1.0, -1.0, 1.0, 1.0])
        terms = policy_loss(log_probs, old, adv, clip_ratio_low=0.2, clip_ratio_high=0.28)
        close(terms.token_losses, [-1.28, 0.8, -0.5, -1.25])
        assert terms.is_clipped.tolist() == [True, True, False, False]
        close(terms.ratio, [1.5, 0.5, 0.5, 1.25])

    def test_is_weights_scale_token_losses(self) -> None:
        terms = policy_loss(torch.zeros(2), torch.zeros(2), T([1.0, 1.0]), clip_ratio_low=0.2, clip_ratio_high=0.2,
                            is_weights=T([2.0, 0.5]))  # fmt: skip
        close(terms.token_losses, [-2.0, -0.5])

    def test_kl_estimators(self) -> None:
        log_probs, ref = T([-1.0]), T([-2.0])
        close(kl_penalty(log_probs, ref, "k1"), [1.0])
        close(kl_penalty(log_probs, ref, "k2"), [0.5])
        close(kl_penalty(log_probs, ref, "low_var_kl"), [math.exp(-1.0)])  # e^-1 - (-1) - 1

    def test_entropy(self) -> None:
        logits = T([[0.0, 0.0], [math.log(3.0), 0.0]])
        close(entropy_from_logits(logits), [math.log(2.0), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))])

    def test_value_loss_clip(self) -> None:
        losses, clipped = value_loss(T([1.0]), T([0.0]), T([0.0]), clip_range=0.5)
        close(losses, [0.5])  # max((1-0)^2, (0.5-0)^2) / 2
        assert not clipped.item()
        losses, clipped = value_loss(T([0.0]), T([1.0]), T([2.0]), clip_range=0.5)
        close(losses, [2.0])  # max(4, 2.25) / 2
        losses, clipped = value_loss(T([2.0]), T([0.0]), T([2.0]), clip_range=0.5)
        close(losses, [0.5 * 1.5**2])
        assert clipped.item()

    @pytest.mark.parametrize(
        ("mode", "expected"), [("token-mean", 2.5), ("seq-mean-token-mean", 3.0), ("seq-mean-token-sum", 5.0)]
    )
    def test_aggregation_modes(self, mode: str, expected: float) -> None:
        values = T([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0]])
        mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
        close(aggregate(values, mask, mode), expected)  # type: ignore[arg-type]

    @pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
    def test_micro_batches_sum_to_the_batch_loss(self, mode: str) -> None:
        generator = torch.Generator().manual_seed(0)
        values = torch.randn(6, 5, generator=generator)
        mask = (torch.rand(6, 5, generator=generator) > 0.3).float()
        whole = aggregate(values, mask, mode)  # type: ignore[arg-type]
        scale = {"num_tokens": mask.sum().item(), "num_seqs": 6.0}
        parts = sum(aggregate(values[i : i + 2], mask[i : i + 2], mode, **scale) for i in range(0, 6, 2))  # type: ignore[arg-type]
        torch.testing.assert_close(parts, whole)


class TestRolloutCorrection:
    def test_truncated_token_weights(self) -> None:
        old = T([[-1.0, -2.0, -1.0]])
        rollout = T([[-2.0, -1.5, -1.0]])
        mask = T([[1.0, 1.0, 0.0]])
        result = token_is_weights(old, rollout, mask, threshold=2.0)
        close(result.weights, [[2.0, math.exp(-0.5), 0.0]])
        assert result.stats["rollout_is/truncated_frac"] == 0.5
        assert result.stats["rollout_is/max"] == pytest.approx(math.e)
        assert result.stats["rollout_is/mean"] == pytest.approx((math.e + math.exp(-0.5)) / 2)
        assert result.stats["rollout_is/log_prob_abs_diff"] == pytest.approx(0.75)
        assert not result.weights.requires_grad


def trajectory(prompt_id: int, child: int, reward: float, response: tuple[int, ...] = (5, 6)) -> Trajectory:
    return Trajectory(
        prompt_id=prompt_id,
        child=child,
        prompt_token_ids=(1, 2),
        response_token_ids=response,
        rollout_log_probs=tuple(-0.5 for _ in response),
        token_versions=tuple(0 for _ in response),
        version=0,
        reward=reward,
    )


class TestObjective:
    def test_dispatch_by_estimator(self) -> None:
        batch = collate([Sample(trajectory(1, 0, 1.0)), Sample(trajectory(1, 1, 0.0))], pad_token_id=0)
        grpo = load_config("demo").algorithm
        adv, returns = compute_advantages(batch, grpo)
        assert returns is None and adv[0, 0] > 0 > adv[1, 0]
        rpp = grpo.model_copy(update={"adv_estimator": "reinforce_plus_plus"})
        adv, returns = compute_advantages(batch, rpp)
        assert returns is not None and returns[0, 1] == 1.0

    def test_actor_loss_adds_kl_and_entropy(self) -> None:
        samples = [Sample(trajectory(1, 0, 1.0)), Sample(trajectory(1, 1, 0.0))]
        for s in samples:
            s.fields.update(
                old_log_probs=torch.full((2,), -0.5),
                advantages=torch.full((2,), 1.0 if s.trajectory.reward else -1.0),
                ref_log_probs=torch.full((2,), -1.5),
            )
        batch = collate(samples, pad_token_id=0)
        log_probs = torch.full((2, 2), -0.5, requires_grad=True)
        entropy = torch.full((2, 2), 2.0)
        base = load_config("demo").algorithm
        algo = base.model_copy(update={"kl_loss_coef": 0.1, "kl_loss_type": "k1", "entropy_coeff": 0.01})
        loss, metrics = actor_loss(log_probs, entropy, batch, algo, Denominators(4.0, 2.0))
        # pg: mean(-1, -1, 1, 1) = 0; kl k1 = 1 per token; entropy 2 per token
        assert loss.item() == pytest.approx(0.0 + 0.1 * 1.0 - 0.01 * 2.0)
        assert float(metrics["actor/clip_frac"]) == 0.0
        assert float(metrics["actor/kl_loss"]) == pytest.approx(1.0)
        assert float(metrics["actor/entropy"]) == pytest.approx(2.0)
        loss.backward()
        assert log_probs.grad is not None
